"""Read back what the metric sinks wrote, with the sinks' own formats and readers.

TensorBoard: ``tensorboard_scalars`` loads an event directory with TensorBoard's
``EventAccumulator`` (which also applies ``purge_step``), ``expected_scalars`` is a log as
TensorBoard stores it.

W&B: ``history_rows`` reads the rows an offline run wrote into its ``run-<id>.wandb`` transaction
log. The file is a LevelDB-style record log: a 7-byte header (":W&B", magic 0xBEE1, version), then
32 KiB blocks of chunks ``crc32 (4) | length (2) | type (1) | payload``, where type 1 is a whole
record and 2/3/4 the first/middle/last piece of one split across blocks; each record is a
``wandb_internal_pb2.Record`` protobuf.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import time
from typing import Dict, Iterator, List

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> Iterator[bytes]:
    assert data[:4] == b":W&B", f"not a W&B transaction log: {data[:7]!r}"
    pos, pieces = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 and length == 0:  # zero padding to the end of the block
            pos += left
            continue
        payload = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            yield payload
        elif kind == FIRST:
            pieces = payload
        elif kind == MIDDLE:
            pieces += payload
        elif kind == LAST:
            yield pieces + payload


def _records(run_dir: str, timeout: float) -> List:
    """Every record of the run's log, once its ``exit`` record is there: W&B's service writes
    the log after ``run.finish()`` returns."""
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + timeout
    while True:
        paths = glob.glob(os.path.join(run_dir, "run-*.wandb"))
        records = []
        if len(paths) == 1:
            with open(paths[0], "rb") as handle:
                data = handle.read()
            for payload in _payloads(data):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(payload)
                records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        if time.monotonic() > deadline:
            raise TimeoutError(f"the W&B log in {run_dir} has no exit record after {timeout} s ({len(paths)} log files)")
        time.sleep(0.05)


def history_rows(run_dir: str, timeout: float = 30.0) -> Dict[int, Dict[str, float]]:
    """``{step: {key: value}}`` of every history row of the finished offline run in ``run_dir``
    (W&B's own ``_step``/``_runtime``/``_timestamp`` keys left out)."""
    rows: Dict[int, Dict[str, float]] = {}
    for record in _records(run_dir, timeout):
        if record.WhichOneof("record_type") != "history":
            continue
        items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        rows[int(record.history.step.num)] = {k: v for k, v in items.items() if not k.startswith("_")}
    return rows


def merged_by_step(log_history: List[Dict[str, float]]) -> Dict[int, Dict[str, float]]:
    """What W&B keeps of a log: rows logged at the same step form one history row."""
    merged: Dict[int, Dict[str, float]] = {}
    for row in log_history:
        values = {k: v for k, v in row.items() if k != "env_step"}
        merged.setdefault(row["env_step"], {}).update(values)
    return merged


def tensorboard_scalars(log_dir: str) -> Dict[str, List]:
    """``{tag: [(step, value), ...]}`` as TensorBoard itself loads them (orphaned events purged)."""
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(log_dir, size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def expected_scalars(log_history: List[Dict[str, float]]) -> Dict[str, List]:
    """The log as TensorBoard stores it: one float32 series per key."""
    import numpy as np

    out: Dict[str, List] = {}
    for row in log_history:
        for key, value in row.items():
            if key != "env_step":
                out.setdefault(key, []).append((row["env_step"], float(np.float32(value))))
    return out
