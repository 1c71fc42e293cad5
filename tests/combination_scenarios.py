"""Data-parallel runs of the combination tests (test_combinations.py), run both in one process and
under torchrun with 2 ranks (through dp_worker.py, ``module="combination_scenarios"``)."""

from dp_scenarios import magrpo, summary

# every buffer/batch ratio the data-parallel promise covers: a buffer of 4 groups in minibatches of
# 2 (two optimizer steps per drain, each rank taking one group of each) and of 4
BATCH_SMALLER_THAN_BUFFER = dict(num_turns=1, rollout_buffer_size=4, train_batch_size=2, output_dir=None)


def run_magrpo_small_batch(paths, out):
    trainer = magrpo(paths, out, **BATCH_SMALLER_THAN_BUFFER)
    trainer.train()
    return summary(trainer)


SCENARIOS = {"magrpo_small_batch": run_magrpo_small_batch}
