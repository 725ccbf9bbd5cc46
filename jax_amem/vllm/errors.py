"""What the trainer's half of the vLLM backend raises; each message names the cause and the fix."""

from ..errors import JaxAmemError


class VllmBackendError(JaxAmemError):
    """The engine cannot take jax-amem updates as it was started (no backend, another backend,
    a worker this process cannot reach)."""


class VllmPlanError(JaxAmemError, ValueError):
    """The trainer's tree or rules do not match the engine's model (names, shapes, dtypes, tp).
    Raised before anything is written."""


class VllmUpdateError(JaxAmemError):
    """An update failed. `served` says what the engine does now: "old" (nothing it serves was
    written: it serves the previous version), "updating" (another update is in flight), "new"
    (written, but the prefix cache not reset), "refusing" (it holds a mix and refuses to run
    until a complete update) or "dead" (a worker process died: vLLM shut the engine down)."""

    def __init__(self, message: str, served: str):
        super().__init__(message)
        self.served = served
