"""Running one task per agent: concurrently (``parallel_training="mp"``) or in order.

With ``parallel=True`` every agent has its own persistent worker thread, so agent i's generation and
updates always run on the same thread (and its device's CUDA context); CUDA kernels and CPU tensor
ops release the GIL, so agents on different devices (or the same one) really run at once. Results
come back in agent order whatever the schedule, and nothing here touches a random generator, so a
task that draws only from the streams it is handed computes the same numbers in both modes.
The threads are shut down by ``close()`` or when the owner is garbage-collected.
"""

from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Optional, Sequence


def _shutdown(executors: List[ThreadPoolExecutor]) -> None:
    for executor in executors:
        executor.shutdown(wait=False, cancel_futures=True)


class AgentWorkers:
    """``map(task, agents)``: ``task(agent)`` for each agent index, results in the order given."""

    def __init__(self, count: int, parallel: bool):
        self.count = count
        self.parallel = bool(parallel) and count > 1
        self._executors: List[ThreadPoolExecutor] = []
        if self.parallel:
            self._executors = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"comlrl-agent{i}") for i in range(count)]
        self._finalizer = weakref.finalize(self, _shutdown, self._executors)

    def map(self, task: Callable[[int], Any], agents: Optional[Sequence[int]] = None) -> List[Any]:
        agents = list(range(self.count)) if agents is None else list(agents)
        if not self.parallel or len(agents) <= 1:
            return [task(agent) for agent in agents]
        futures = [self._executors[agent].submit(task, agent) for agent in agents]
        results, first_error = [], None
        for future in futures:  # wait for every task, then raise the first failure in agent order
            try:
                results.append(future.result())
            except BaseException as error:  # noqa: BLE001 - re-raised below
                first_error = first_error or error
                results.append(None)
        if first_error is not None:
            raise first_error
        return results

    def close(self) -> None:
        self._finalizer()
