"""Which model the engines serve a call with, whatever name the client sent.

Clients send the name their own docs use (`default`, `your-model-name`, `Qwen/Qwen3-0.6B`);
the gateway serves one policy, so by default any name reaches it. The answer reports the name
the client asked for, the Step records both.
"""

from __future__ import annotations

from claw_stream.dialect import OpenAIError
from claw_stream.gateway.upstreams import BackendPool
from claw_stream.names import adapter_version


class ModelNames:
    def __init__(self, pool: BackendPool, model_map: dict[str, str], strict: bool):
        self.pool = pool
        self.model_map = model_map
        self.strict = strict

    def resolve(self, asked: str) -> str:
        """The name to send the engines for `asked`; 404 for a name none can serve.

        A name some engine serves goes as it is, and so does a versioned adapter name
        (`policy@v3`): its version matters to training, so an unknown one is the engine's 404,
        never silently the newest policy.
        """
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
