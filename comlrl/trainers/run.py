"""The run: where a trainer is in its data, and the loop that drives its step.

``Run.train`` validates the run (generation settings, data-parallel split, checkpoint source),
claims the metrics log, starts the run record and then runs the trainer's ``body`` (by default
``run_epochs``) with signal handling (``checkpoint.interrupt``); ``run_epochs`` is the epoch loop
every step shares:

    for every epoch:                      (from the checkpointed position)
        for every step of items:          (the step's chunks of the epoch)
            evaluate when due             (the step says when)
            step.train_step(items)        (this process's share of them)
            log, progress, checkpoint when due; stop when preempted
        step.flush()                      (update on what the buffers still hold)
        log the epoch's means, checkpoint when due; stop when preempted

A preempted run (SIGUSR1 / SIGTERM noted, or the soft deadline: ``CheckpointStore.boundary``) ends
with ``TrainingPreempted`` after its checkpoint; the job log gets one line saying why, where and how
to continue.

The run owns the reporting (``Reporting``), the progress cursor (``TrainingState``) and the
checkpoints (``CheckpointStore`` over ``RunCheckpoints``).

Ownership runs one way: the trainer holds its run, evaluation and step, the run holds its step and
checkpoint contents, and a part that needs its owner back holds ``owner_view(owner)``, a weak proxy.
No reference cycle then passes through the models, so they are freed as soon as the trainer is
(``Trainer``'s "Lifetime").
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple

import torch
import torch.nn as nn

from comlrl.checkpoint import layout
from comlrl.checkpoint.interrupt import Interruptible, TrainingPreempted
from comlrl.checkpoint.schedule import CheckpointSchedule
from comlrl.checkpoint.store import CheckpointStore
from comlrl.rollout.tree import TreeRollout
from comlrl.rollout.generation import GENERATION_KEY_FIELDS, RESERVED_GENERATION_KEYS, SamplingParams, refused_generation_keys
from comlrl.rollout.rows import labelled_rows
from comlrl.telemetry.progress import ProgressBar, RunClock, remaining_evaluations, remaining_steps
from comlrl.telemetry.run_record import describe_data, describe_model, describe_reward, scheduler_note
from comlrl.trainers.combinations import check_data_parallel
from comlrl.trainers.construction import Task
from comlrl.trainers.datasets import dataset_length, is_map_dataset
from comlrl.trainers.reporting import Reporting
from comlrl.trainers.team import Team


def owner_view(owner: Any) -> Any:
    """``owner`` as a part it owns holds it: a weak proxy (``owner`` itself when already one), so the
    part keeps no cycle alive (see the module docstring). A bound method taken through the proxy holds
    the owner: look methods up at each call (``lambda: view.evaluate()``)."""
    return owner if isinstance(owner, weakref.ProxyTypes) else weakref.proxy(owner)


@dataclass
class TrainingState:
    """Where a run is: the cursor a checkpoint needs to continue from the exact same step."""

    epoch: int = 0  # epochs completed
    position: int = 0  # training items consumed in the current epoch
    env_step: int = 0  # joint rewards computed so far (the x-axis of every log)
    global_step: int = 0  # training steps (one rollout + its updates) so far


class Step(Protocol):
    """One training step of an algorithm family, as the run drives it."""

    def items_per_step(self) -> int:
        """Items (dataset rows, or preference pairs) one step consumes."""

    def epoch_length(self) -> Optional[int]:
        """Items one epoch visits (None: unknown, an iterable dataset)."""

    def epoch_chunks(self, start: int) -> Iterator[Tuple[int, List[Any]]]:
        """``(first item index, items)`` of the epoch's steps from item ``start``."""

    def evaluation_due(self, start: int, count: int) -> bool:
        """Whether an evaluation runs before the step over items ``start .. start + count``."""

    def train_step(self, items: List[Any], item_ids: Optional[List[int]]) -> None:
        """Roll out ``items`` (this process's share of the step; ``item_ids`` their indices in the
        whole step, the identity of their random streams) and update."""

    def flush(self) -> None:
        """Update on whatever the buffers hold at the end of an epoch."""


class DatasetEpochs:
    """The epoch methods of a step that walks the training dataset (the MAGRPO family, the actor-critic
    family): ``self.run`` and ``self.items_per_step()`` are the step's."""

    run: "Run"

    def items_per_step(self) -> int:
        raise NotImplementedError

    def epoch_length(self) -> Optional[int]:
        return dataset_length(self.run.task.train_dataset)

    def epoch_chunks(self, start: int) -> Iterator[Tuple[int, List[Any]]]:
        return dataset_steps(self.run.task.train_dataset, start, self.items_per_step())

    def evaluation_due(self, start: int, count: int) -> bool:
        return self.run.item_schedule_due(start, count)


def dataset_steps(dataset: Any, start: int, size: int) -> Iterator[Tuple[int, List[Any]]]:
    """``(position, items)`` of consecutive steps of ``size`` items, from item ``start`` on."""
    if is_map_dataset(dataset):
        length = len(dataset)
        for first in range(start, length, size):
            yield first, [dataset[i] for i in range(first, min(first + size, length))]
        return
    iterator = iter(dataset)
    for _ in range(start):
        next(iterator, None)
    position, items = start, []
    for item in iterator:
        items.append(item)
        if len(items) == size:
            yield position, items
            position, items = position + size, []
    if items:
        yield position, items


def logged_evaluation(run: "Run", report: Callable[[List[Any]], Any], num_eval_samples: Optional[int]) -> Dict[str, float]:
    """``evaluate()`` of every family: ``report(items).metrics`` on up to ``num_eval_samples`` eval
    items, written to the run's metrics; an empty dict without an eval dataset or with 0 samples."""
    items = evaluation_items(run.args, run.task.eval_dataset, num_eval_samples)
    if not items:
        return {}
    metrics = report(items).metrics
    run.metrics.write(metrics, run.state.env_step)
    return metrics


def evaluation_items(args: Any, dataset: Any, num_eval_samples: Optional[int]) -> List[Any]:
    """Up to ``num_eval_samples`` (default ``args.eval_num_samples``) items of ``dataset``; none
    without a dataset or for a count of 0."""
    if dataset is None:
        return []
    count = args.eval_num_samples if num_eval_samples is None else int(num_eval_samples)
    if count <= 0:
        return []
    if is_map_dataset(dataset):
        return [dataset[i] for i in range(min(count, len(dataset)))]
    items = []
    for item in dataset:
        if len(items) >= count:
            break
        items.append(item)
    return items


class Run:
    """One trainer's run (see the module docstring). ``evaluate``: the trainer's evaluation;
    ``models``: ``(role, model, source)`` of every trained model for ``run_summary.json``."""

    def __init__(self, *, args: Any, name: str, class_name: str, team: Team, task: Task, reporting: Reporting,
                 evaluate: Callable[[], Any], models: Callable[[], List[Tuple[str, nn.Module, Any]]]):
        from comlrl.trainers.run_checkpoints import RunCheckpoints

        self.args = args
        self.name = name
        self.class_name = class_name
        self.team = team
        self.task = task
        self.reporting = reporting
        self.evaluate = evaluate
        self.models = models
        self.state = TrainingState()
        self.generation_kwargs: Dict[str, Any] = {}
        self.step: Optional[Step] = None
        self.body: Optional[Callable[[], None]] = None  # what train() runs; None: run_epochs (a part may set its own)
        self.contents = RunCheckpoints(owner_view(self))
        self.checkpoints = CheckpointStore(self.contents)
        self.after_epoch_checkpoint: Optional[Callable[[int, bool], Optional[str]]] = None  # None: epoch_checkpoint
        self.clock: Optional[RunClock] = None  # the remaining-time estimate of the running epochs

    @property
    def metrics(self):
        return self.reporting.metrics

    @property
    def verbose(self) -> bool:
        return self.reporting.verbose

    # ------------------------------------------------------------------ train()
    def train(self, schedule: CheckpointSchedule, resume_from_checkpoint: Any, generation_kwargs: Mapping[str, Any]) -> None:
        """Train until ``args.num_train_epochs`` epochs are complete (see the module docstring)."""
        self.set_generation_kwargs(generation_kwargs)
        if self.task.train_dataset is None:
            raise ValueError("train_dataset is required to train; pass train_dataset=... to the trainer.")
        self.check_data_parallel()
        store = self.checkpoints
        store.begin(resume_from_checkpoint, schedule)
        self.metrics.claim()  # a resumed run has claimed its log in the restore; a new one must not mix
        record = self.reporting.record
        if record is not None:
            record.start(
                trainer=self.class_name.rsplit(".", 1)[-1], config=self.args, wandb_config=self.reporting.wandb_config,
                seed=torch.initial_seed(),
                models=[{"role": role, "source": describe_model(role, model, source)["source"]} for role, model, source in self.models()],
                data={"train": describe_data(self.task.train_dataset), "eval": describe_data(self.task.eval_dataset)},
                reward=describe_reward(self.task.reward_func), run_id=store.run_id, resumed_from=store.resumed_from,
            )
            if store.resumed_from is not None:
                store.log(f"comlrl: attempt {record.attempt} of run {store.run_id}{scheduler_note()}, from {store.resumed_from}")
        store.active = True
        error: Optional[BaseException] = None
        store.interrupt = Interruptible(defer=schedule.directory is not None, notice=store.stop_notice(schedule))
        try:
            with store.interrupt:
                (self.body or self.run_epochs)()
        except TrainingPreempted as stop:  # at a step boundary, checkpointed: the state is whole
            error, stop.where = stop, self.describe_position()
            if self.team.dist.is_main:
                store.log(f"comlrl: {stop.reason} stopped the run after {stop.where}; checkpoint {stop.checkpoint}; exiting with "
                          f"code {stop.exit_code}: run the same command with --resume auto (resume_from_checkpoint='auto') to continue")
            raise
        except BaseException as exc:
            error = exc
            store.failure = f"epoch {self.state.epoch + 1}, item {self.state.position} (global step {self.state.global_step})"
            raise
        finally:
            store.finish()
            self.finish_record(error)
        store.failure = None

    def describe_position(self) -> str:
        state = self.state
        where = f"epoch {state.epoch} complete" if state.position == 0 else f"epoch {state.epoch + 1}, item {state.position}"
        return f"global step {state.global_step} ({where})"

    def finish_record(self, error: Optional[BaseException]) -> None:
        record = self.reporting.record
        if record is None:
            return
        models = [describe_model(name, model, source) for name, model, source in self.models()]
        record.finish(error=error, models=models, progress=asdict(self.state), history=self.reporting.log_history,
                      run_id=self.checkpoints.run_id)

    def check_data_parallel(self) -> None:
        check_data_parallel(self.args, self.team.dist, self.step.items_per_step(), self.task.train_dataset)

    def set_generation_kwargs(self, kwargs: Mapping[str, Any]) -> None:
        from transformers import GenerationConfig

        reserved = sorted(set(kwargs) & RESERVED_GENERATION_KEYS)
        if reserved:
            raise ValueError(f"train() cannot override {reserved}; set them in the config ({type(self.args).__name__}).")
        known = set(GenerationConfig().to_dict())
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"train() got unknown generation settings {unknown}; see transformers.GenerationConfig.")
        changing = refused_generation_keys(kwargs)
        if changing:
            fields = ", ".join(f"{key} -> {GENERATION_KEY_FIELDS[key]}" for key in changing if key in GENERATION_KEY_FIELDS)
            raise ValueError(
                f"train() got generation settings {changing} that change the distribution tokens are sampled from, while the "
                f"update scores them under softmax(logits / temperature): the recorded log-probs, importance ratios and KL "
                f"would be of another policy. Set the sampling in the config ({type(self.args).__name__}: temperature, top_p, "
                f"top_k, max_new_tokens{'; ' + fields if fields else ''}) and remove them."
            )
        if kwargs and self.args.generation_backend == "vllm":
            raise ValueError(
                f"generation_backend='vllm' does not forward train() generation settings {sorted(kwargs)}; remove them or "
                f"use generation_backend='hf'."
            )
        self.generation_kwargs = dict(kwargs)

    # ------------------------------------------------------------------ the epoch loop
    def run_epochs(self) -> None:
        step, state, metrics = self.step, self.state, self.metrics
        total = self.args.num_train_epochs
        length = step.epoch_length()
        where = (length, step.items_per_step(), state.epoch, state.position, total)
        interval = self.args.eval_interval if self.task.eval_dataset is not None else 0
        self.clock = timer = RunClock(remaining_steps(*where), remaining_evaluations(*where, interval))
        while state.epoch < total:
            bar = ProgressBar(total=length, initial=state.position, enabled=self.verbose, desc=f"{self.name} epoch {state.epoch + 1}/{total}")
            try:
                for start, items, last in self._epoch_steps(state.position):
                    self.maybe_evaluate(start, len(items))
                    local, ids = self.team.dist.shard(start, items)
                    with labelled_rows(items, start):  # errors on a row name it (train_dataset row N)
                        step.train_step(local, ids)
                    state.position = start + len(items)
                    state.global_step += 1
                    # The epoch's last step is logged with the epoch's means, after the buffers drain.
                    note = timer.step_done()
                    bar.estimate(timer.left())
                    bar.update(len(items), None if last else metrics.flush(state.env_step))
                    if note:
                        bar.note(f"{self.name}: {note}")
                    self.checkpoints.after_step(state.global_step)
                step.flush()
                metrics.record(metrics.epoch_summary(state.epoch + 1))
                bar.finish(metrics.flush(state.env_step, force=True))
            finally:
                bar.close()
            state.epoch += 1
            state.position = 0
            saved = (self.after_epoch_checkpoint or self.epoch_checkpoint)(state.epoch, state.epoch >= total)
            if state.epoch < total:  # a boundary where the run may save and stop (after the last epoch it ends anyway)
                self.checkpoints.boundary(layout.epoch_checkpoint_name(state.epoch), saved)

    def epoch_checkpoint(self, epoch: int, final: bool) -> Optional[str]:
        """The checkpoint after an epoch, when one is due (``checkpoint-<epoch>``); returns it."""
        if self.checkpoints.due_after_epoch(epoch, final):
            return self.checkpoints.save_to_directory(layout.epoch_checkpoint_name(epoch))
        return None

    def _epoch_steps(self, start: int) -> Iterator[Tuple[int, List[Any], bool]]:
        """``(first item index, items, is the epoch's last step)`` for every step from ``start``."""
        pending = None
        for chunk in self.step.epoch_chunks(start):
            if pending is not None:
                yield (*pending, False)
            pending = chunk
        if pending is not None:
            yield (*pending, True)

    def maybe_evaluate(self, start: int, count: int) -> None:
        if self.task.eval_dataset is None or not self.step.evaluation_due(start, count):
            return
        with self.team.unsharded(), self.clock.evaluating():  # every rank unshards; rank 0 evaluates for the run
            if self.team.dist.is_main:
                self.evaluate()

    # ------------------------------------------------------------------ services to the steps
    @property
    def env_step(self) -> int:
        return self.state.env_step

    def sampling(self, *, greedy: bool = False) -> SamplingParams:
        a = self.args
        return SamplingParams(a.max_new_tokens, a.temperature, a.top_p, a.top_k, do_sample=not greedy, extra=dict(self.generation_kwargs))

    def tree(self, *, reward: Any, num_generations: int, joint_mode: str, greedy: bool,
             early_termination_threshold: Optional[float], reference_kl: bool) -> TreeRollout:
        """A ``TreeRollout`` over the team's agents and the task's formatters; with ``reference_kl``
        every level's rows are also scored for their KL to the reference."""
        a, policies = self.args, self.team.policies
        scorer = None
        if reference_kl:
            def scorer(agent: int, completions: Any) -> Dict[str, Any]:
                return policies[agent].rollout_extras(completions, a.temperature, reference_kl=True)
        return TreeRollout(
            generators=[p.generator for p in policies], formatters=self.task.formatters, reward=reward,
            num_generations=num_generations, num_turns=a.num_turns, joint_mode=joint_mode, discount=a.discount,
            sampling=self.sampling(greedy=greedy), early_termination_threshold=early_termination_threshold,
            external_transition=self.task.external_transition, external_prompt_passthrough=a.external_prompt_passthrough,
            row_scorer=scorer, map_agents=self.team.workers.map,
        )

    def record_signal(self, reward_groups: Sequence[Sequence[float]], completion_groups: Sequence[Sequence[str]]) -> None:
        self.reporting.record_signal(reward_groups, completion_groups, self.state.env_step)

    def item_schedule_due(self, start: int, count: int) -> bool:
        """The item-based evaluation schedule: before every ``eval_interval``-th item of an epoch."""
        interval = self.args.eval_interval
        return interval > 0 and any((start + offset) % interval == 0 for offset in range(count))
