"""NCCL pause/resume for JAX: every communicator in the process, XLA's own included.

`import jax_amem` installs the interposer (before JAX starts its GPU backend);
then `pause()` frees the communicators' GPU memory and `resume()` brings them
back behind the same handles, so XLA's cached communicators keep working. The verbs are
jax_amem's own for the whole process: pause, resume, is_paused, and `paused(...)`, a block
of the same shape as `jax_amem.paused` (p.info, p.restored).
"""

from ._api import (Communicator, NcclArgumentError, NcclNotInstalledError, NcclPauseError, NcclReport, can_suspend,
                   communicators, cost_rates, install, is_installed, is_paused, keep_suspendable, nccl_version,
                   pause, in_a_job, paused, paused_ids, recover, resume, resume_owed, status)

__all__ = ["Communicator", "NcclArgumentError", "NcclNotInstalledError", "NcclPauseError", "NcclReport", "can_suspend",
           "communicators", "cost_rates", "install", "is_installed", "is_paused", "keep_suspendable", "nccl_version",
           "pause",
           "in_a_job", "paused", "paused_ids", "recover", "resume", "resume_owed", "status"]
