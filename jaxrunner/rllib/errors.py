"""The error JaxEnvRunner raises for RLlib setups it cannot run."""

from __future__ import annotations

SUPPORTED = (
    "JaxEnvRunner supports: single-agent RLlib algorithms on the new API stack with "
    "framework='torch' (PPO; APPO and IMPALA) and their default torch RLModule "
    "(DefaultPPOTorchRLModule / DefaultAPPOTorchRLModule): an MLP encoder "
    "(fcnet_hiddens, fcnet_activation, fcnet_use_layernorm, vf_share_layers) and an MLP pi "
    "head (head_fcnet_hiddens, head_fcnet_activation, head_fcnet_use_layernorm, "
    "free_log_std, log_std_clip_param), on a 1-D Box observation space and a Discrete or "
    "1-D Box action space, with RLlib's default (stateless) connector pipelines, sampling a "
    "JAX env (a gymnax id, a name given to jaxrunner.register_env or "
    "ray.tune.registry.register_env whose creator returns a gymnax-style (env, env_params), "
    "or such a creator callable)."
)


class UnsupportedRLlibSetupError(ValueError):
    """An RLlib config, module or weight format that JaxEnvRunner cannot run.

    The message says what was found, why the compiled runner cannot reproduce it, and
    what is supported (`SUPPORTED`).
    """

    def __init__(self, message: str):
        super().__init__(f"{message}\n{SUPPORTED}")
