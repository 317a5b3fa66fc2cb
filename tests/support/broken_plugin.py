"""A plugin module that raises when imported (a typo, a missing dependency, ...)."""

raise ImportError("broken_plugin needs a package that is not installed")
