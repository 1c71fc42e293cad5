"""How ``TrainerBase`` walks its data: epochs of steps from a checkpointed position, and the items
an evaluation reads (``EpochLoop``, a mixin of ``TrainerBase``)."""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Tuple

from comlrl.rollout.rows import labelled_rows
from comlrl.telemetry.progress import ProgressBar, RunClock, remaining_evaluations, remaining_steps
from comlrl.trainers.datasets import dataset_length, is_map_dataset


class EpochLoop:
    """The epochs of ``TrainerBase``: steps over the training items from a checkpointed position (map-style
    datasets shuffled per epoch, iterable ones streamed), evaluation on its schedule, and the items an
    evaluation reads."""

    def _run_epochs(self) -> None:
        total = self.args.num_train_epochs
        length = self._epoch_length()
        where = (length, self._items_per_step(), self.state.epoch, self.state.position, total)
        interval = self.args.eval_interval if self.eval_dataset is not None else 0
        self._run_clock = timer = RunClock(remaining_steps(*where), remaining_evaluations(*where, interval))
        while self.state.epoch < total:
            bar = ProgressBar(
                total=length, initial=self.state.position, enabled=self.verbose,
                desc=f"{self.algorithm_name} epoch {self.state.epoch + 1}/{total}",
            )
            try:
                for start, items, last in self._epoch_steps(self.state.position):
                    self._maybe_evaluate(start, len(items))
                    local, ids = self._dist.shard(start, items)
                    with labelled_rows(items, start):  # errors on a row name it (train_dataset row N)
                        self._train_step(local, ids)
                    self.state.position = start + len(items)
                    self.state.global_step += 1
                    # The epoch's last step is logged with the epoch's means, after the buffers drain.
                    note = timer.step_done()
                    bar.estimate(timer.left())
                    bar.update(len(items), None if last else self.metrics.flush(self.env_step))
                    if note:
                        bar.note(f"{self.algorithm_name}: {note}")
                    self._after_step()
                    self._checkpoint_after_step(self.state.global_step)
                self._flush_buffers()
                self.metrics.record(self.metrics.epoch_summary(self.state.epoch + 1))
                bar.finish(self.metrics.flush(self.env_step, force=True))
            finally:
                bar.close()
            self.state.epoch += 1
            self.state.position = 0
            self._after_epoch()
            self._checkpoint_after_epoch(self.state.epoch, final=self.state.epoch >= total)

    def _epoch_length(self) -> Optional[int]:
        """Items one epoch visits (the training dataset's length; None when it has none)."""
        return dataset_length(self.train_dataset)

    def _epoch_steps(self, start: int) -> Iterator[Tuple[int, List[Any], bool]]:
        """``(first item index, items, is the epoch's last step)`` for every step from ``start``."""
        pending = None
        for step in self._epoch_chunks(start):
            if pending is not None:
                yield (*pending, False)
            pending = step
        if pending is not None:
            yield (*pending, True)

    def _epoch_chunks(self, start: int) -> Iterator[Tuple[int, List[Any]]]:
        """``(first item index, items)`` of the epoch's steps from ``start`` (trainers that step over
        something other than the training dataset override this)."""
        return self._dataset_steps(self.train_dataset, start, self._items_per_step())

    @staticmethod
    def _dataset_steps(dataset: Any, start: int, size: int) -> Iterator[Tuple[int, List[Any]]]:
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

    def _maybe_evaluate(self, start: int, count: int) -> None:
        interval = self.args.eval_interval
        if self.eval_dataset is None or interval <= 0:
            return
        if any((start + offset) % interval == 0 for offset in range(count)):
            with self._unsharded(), self._run_clock.evaluating():  # every rank unshards; rank 0 evaluates for the run
                if self._dist.is_main:
                    self.evaluate()

    # ------------------------------------------------------------------ evaluation items
    def _evaluation_items(self, num_eval_samples: Optional[int]) -> List[Any]:
        """Up to ``num_eval_samples`` (default ``args.eval_num_samples``) eval items; none without an
        eval dataset or for a count of 0."""
        if self.eval_dataset is None:
            return []
        count = self.args.eval_num_samples if num_eval_samples is None else int(num_eval_samples)
        return self._eval_items(count) if count > 0 else []

    def _eval_items(self, count: int) -> List[Any]:
        dataset = self.eval_dataset
        if is_map_dataset(dataset):
            return [dataset[i] for i in range(min(count, len(dataset)))]
        items = []
        for item in dataset:
            if len(items) >= count:
                break
            items.append(item)
        return items
