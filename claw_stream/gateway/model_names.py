"""Which model the engines serve a call with, whatever name the client sent.

Clients send the name their own docs use (`default`, `your-model-name`, `Qwen/Qwen3-0.6B`);
the gateway serves one policy, so by default any name reaches it. A tenant's call (tenants.py)
goes to the newest adapter of that tenant the engines list (`alice@v7`), where it has one. The
answer reports the name the client asked for, the Step records both.
"""

from __future__ import annotations

from claw_stream.dialect import OpenAIError
from claw_stream.gateway.upstreams import BackendPool
from claw_stream.names import adapter_policy, adapter_version


class ModelNames:
    def __init__(
        self, pool: BackendPool, model_map: dict[str, str], strict: bool, policy: str = "policy"
    ):
        self.pool = pool
        self.model_map = model_map
        self.strict = strict
        self.policy = policy

    def resolve(self, asked: str, tenant: str | None = None) -> str:
        """The name to send the engines for `asked`, called for `tenant`; 404 for a name none
        can serve.

        A name some engine serves goes as it is, and so does a versioned adapter name
        (`policy@v3`): its version matters to training, so an unknown one is the engine's 404,
        never silently the newest policy. Another tenant's adapter is a 404 as if it did not
        exist: a tenant is never served another's adapter, nor told which tenants there are.
        """
        owner = adapter_policy(asked)
        if owner is not None and owner not in (self.policy, tenant):
            raise OpenAIError(404, f"The model `{asked}` does not exist.", param="model")
        if tenant is not None and owner is None and (own := self.newest_of(tenant)) is not None:
            return own
        mapped = self.model_map.get(asked)
        if mapped is not None:
            return mapped
        backends = self.pool.backends
        for backend in backends:
            if asked in backend.models:
                return asked
        if adapter_version(asked) is not None:
            return asked
        if self.strict:
            raise OpenAIError(404, f"The model `{asked}` does not exist.", param="model")
        for backend in backends:
            if backend.models:
                return backend.models[0]
        return asked  # no engine listed its models yet: it answers for the name itself

    def newest_of(self, tenant: str) -> str | None:
        """The newest `tenant@vN` the engines list, if any (`None`: the shared policy serves)."""
        newest: tuple[int, str] | None = None
        for backend in self.pool.backends:
            for name in backend.models:
                if adapter_policy(name) == tenant:
                    version = adapter_version(name) or 0
                    if newest is None or version > newest[0]:
                        newest = (version, name)
        return newest[1] if newest is not None else None
