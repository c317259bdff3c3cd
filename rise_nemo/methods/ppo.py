"""PPO and RRL on a verifier's sparse reward (docs/DESIGN.md §7, §9): a critic and GAE; RRL adds a per-problem
replay buffer of value-selected states (Algorithm 1). GAE is the reasoning step's
(rise_nemo.steps.reasoning), the replay hooks rise_nemo.steps.rrl."""

from rise_nemo.methods.registry import REASONING, ReasoningMethod, register_method

# The paper settings of PPO-family reasoning methods (RRL's paper, docs/DESIGN.md §7): token KL 0.001,
# temperature 0.8, top-p 0.9.
PPO_DEFAULTS = {"policy_loss.kl_coef": 0.001, "sampling.temperature": 0.8, "sampling.top_p": 0.9}

REASONING.advantages.declare("gae", "critic values and GAE on the sparse reward (core.value)", critic=True)
REASONING.hooks.declare("rrl", "RRL's replay buffer: start states, state search, stabilisation rule", critic=True)

register_method(ReasoningMethod("ppo", "PPO with a critic and GAE on a sparse verifier reward", advantage="gae",
                                defaults=dict(PPO_DEFAULTS)))
register_method(ReasoningMethod("rrl", "RRL: PPO whose rollouts may continue value-selected states from a per-problem "
                                "replay buffer (Algorithm 1; state tokens masked, eq. 3)", advantage="gae", hooks="rrl",
                                defaults=dict(PPO_DEFAULTS)))
