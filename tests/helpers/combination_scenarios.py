"""Data-parallel runs of the combination tests (test_combinations.py), run both in one process and
under torchrun with 2 ranks (through dp_worker.py, ``module="combination_scenarios"``)."""

import tests.helpers.combination_matrix as matrix
from datasets import Dataset
from tests.helpers.dp_scenarios import LR, PROMPTS, magrpo, reward, summary

from comlrl.trainers.actor_critic import IACConfig, IACTrainer

# every buffer/batch ratio the data-parallel promise covers: a buffer of 4 groups in minibatches of
# 2 (two optimizer steps per drain, each rank taking one group of each) and of 4
BATCH_SMALLER_THAN_BUFFER = dict(num_turns=1, rollout_buffer_size=4, train_batch_size=2, output_dir=None)


def run_magrpo_small_batch(paths, out):
    trainer = magrpo(paths, out, **BATCH_SMALLER_THAN_BUFFER)
    trainer.train()
    return summary(trainer)


def run_magrpo_batch_scale(paths, out):
    """TRL's batch scale (the std of the raw rewards over every rank's groups of the drained buffer) and
    DAPO's token mean (the step's tokens summed over ranks), with the same small minibatches."""
    trainer = magrpo(paths, out, **BATCH_SMALLER_THAN_BUFFER, scale_rewards="batch", loss_type="dapo")
    trainer.train()
    return summary(trainer)


def run_iac_small_batch(paths, out):
    """IAC with separate critics, K = 2: a buffer of 4 samples per actor in minibatches of 2."""
    args = IACConfig(num_turns=1, num_generations=2, max_new_tokens=4, num_train_epochs=2, verbose=False, rollout_buffer_size=4,
                     train_batch_size=2, agent_learning_rate=LR, critic_learning_rate=LR, eval_interval=0, weight_decay=0.0,
                     logging_steps=1)
    trainer = IACTrainer(agent_model=paths["llama"], critic_model=paths["llama"], reward_func=reward, args=args,
                         train_dataset=Dataset.from_dict({"prompt": PROMPTS}))
    trainer.train()
    return summary(trainer, trainer.critics)


def dp2_cells():
    """The matrix cells with 2-rank data parallelism that are not refused: dp2 alone and its accepted pairs."""
    cells = [("dp2",)] + [pair for pair in matrix.pairs() if "dp2" in pair and frozenset(pair) not in matrix.REFUSED]
    return [tuple(f for f in cell if f != "dp2") for cell in cells]


def run_matrix_dp2(paths, out):
    """Every accepted dp2 cell in this one launch (the features other than dp2; torchrun supplies it)."""
    return {"+".join(cell) or "base": matrix.run(paths, cell) for cell in dp2_cells()}


SCENARIOS = {"magrpo_small_batch": run_magrpo_small_batch, "magrpo_batch_scale": run_magrpo_batch_scale, "iac_small_batch": run_iac_small_batch, "matrix_dp2": run_matrix_dp2}
