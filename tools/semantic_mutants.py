"""Inject semantic mutants at the trainers' use sites and show that the tests kill every one.

Each mutant is a one-line source edit (a sign flip, a dropped term, a disabled clip) in a temporary
copy of the repository; the named test subset runs against the copy and must fail. The unmutated
copy runs first and must pass, so a "kill" is never a broken setup.

    python tools/semantic_mutants.py                 # every mutant, the default test subset
    python tools/semantic_mutants.py --list          # names and what they change
    python tools/semantic_mutants.py --only kl_dropped_magrpo --tests tests/trainers/test_kl_and_critic_settings.py

Exit status 0 when every mutant is killed. The results are recorded in docs/testing.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import List, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The fast tests that guard learning itself (none is marked slow).
DEFAULT_TESTS = [
    "tests/trainers/reinforce/test_direction.py",
    "tests/trainers/actor_critic/test_direction.py",
    "tests/trainers/test_optimisation_mechanisms.py",
    "tests/trainers/test_kl_and_critic_settings.py",
    "tests/trainers/actor_critic/test_multiturn.py",
]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once (kept short, so that it survives nearby edits)
    new: str
    what: str


MUTANTS = [
    Mutant("magrpo_advantages_zeroed", "comlrl/trainers/reinforce/step.py",
           "advantages = self.credit.advantages(group)",
           "advantages = [0.0 * a for a in self.credit.advantages(group)]",
           "MAGRPO family: every advantage is 0"),
    Mutant("magrpo_advantages_negated", "comlrl/trainers/reinforce/step.py",
           "advantages = self.credit.advantages(group)",
           "advantages = [-a for a in self.credit.advantages(group)]",
           "MAGRPO family: advantages negated"),
    Mutant("policy_loss_advantages_negated", "comlrl/trainers/update.py",
           "torch.tensor(rows.advantages[at], device=agent.device), weights,",
           "-torch.tensor(rows.advantages[at], device=agent.device), weights,",
           "the shared policy loss gets negated advantages (every trainer)"),
    Mutant("actor_critic_advantages_zeroed", "comlrl/trainers/actor_critic/step.py",
           "float(sample.normalized_advantage), 1.0 / len(samples),",
           "0.0 * float(sample.normalized_advantage), 1.0 / len(samples),",
           "IAC/MAAC: every actor advantage is 0"),
    Mutant("actor_critic_advantages_negated", "comlrl/trainers/actor_critic/step.py",
           "float(sample.normalized_advantage), 1.0 / len(samples),",
           "-float(sample.normalized_advantage), 1.0 / len(samples),",
           "IAC/MAAC: actor advantages negated"),
    Mutant("critic_value_loss_negated", "comlrl/trainers/actor_critic/updates.py",
           "loss = coef * err * share",
           "loss = -coef * err * share",
           "separate critics (IAC, MAAC) ascend their value loss"),
    Mutant("value_head_loss_negated", "comlrl/trainers/actor_critic/updates.py",
           "return self.coef * err * share, metrics",
           "return -self.coef * err * share, metrics",
           "value heads on the actors ascend their value loss"),
    Mutant("kl_dropped_magrpo", "comlrl/trainers/reinforce/group_credit.py",
           "returns = returns - self.kl_penalty * sample.reference_log_ratio.float()",
           "returns = returns",
           "MAGRPO family: the reference-KL penalty is not subtracted"),
    Mutant("kl_dropped_actor_critic", "comlrl/trainers/actor_critic/samples.py",
           'penalty = kl_coef * float(extras["reference_log_ratio"][row])',
           "penalty = 0.0",
           "IAC/MAAC: rewards are not penalised by the reference KL"),
    Mutant("td_targets_without_discount", "comlrl/trainers/actor_critic/step.py",
           "assign_td_targets(tree, a.discount, a.critic_type)",
           "assign_td_targets(tree, 1.0, a.critic_type)",
           "IAC/MAAC: TD targets ignore the discount"),
    Mutant("gradient_clipping_noop", "comlrl/trainers/optim.py",
           "limit = self.max_grad_norm if self.max_grad_norm is not None else math.inf",
           "limit = math.inf",
           "max_grad_norm never clips"),
    Mutant("importance_clipping_off", "comlrl/trainers/update.py",
           "temperature=args.temperature, loss=get_policy_loss(loss_type), clip_low=args.importance_clip_range, clip_high=clip_high,",
           "temperature=args.temperature, loss=get_policy_loss(loss_type), clip_low=None, clip_high=None,",
           "every family: stale samples are importance-weighted without the PPO clip"),
]


def copy_repository(target: str) -> None:
    for name in ("comlrl", "tests"):
        shutil.copytree(os.path.join(ROOT, name), os.path.join(target, name), ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(os.path.join(ROOT, "pyproject.toml"), target)


def run_tests(copy: str, tests: Sequence[str], timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=copy, PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-rf", "-p", "no:cacheprovider", *tests]
    return subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)


def check_import(copy: str) -> None:
    env = dict(os.environ, PYTHONPATH=copy)
    found = subprocess.run([sys.executable, "-c", "import comlrl; print(comlrl.__file__)"], cwd=copy, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not found.startswith(copy):
        raise SystemExit(f"the copy's comlrl is not the one imported ({found}); is another on sys.path first?")


def summary_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    failed = next((line.split(" - ")[0] for line in lines if line.startswith("FAILED")), "")
    return (failed or (lines[-1] if lines else "")).strip()[:160]  # the killing test, or the summary


def apply(copy: str, mutant: Mutant) -> str:
    path = os.path.join(copy, mutant.path)
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    count = source.count(mutant.old)
    if count != 1:
        raise SystemExit(f"{mutant.name}: the anchor occurs {count} times in {mutant.path}; update the mutant")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(source.replace(mutant.old, mutant.new))
    return source


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", nargs="+", default=DEFAULT_TESTS, help="test files or node ids to run per mutant")
    parser.add_argument("--only", nargs="+", help="mutant names to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per test run")
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:40s} {m.path}: {m.what}")
        return 0
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    unknown = sorted(set(args.only or []) - {m.name for m in MUTANTS})
    if unknown:
        raise SystemExit(f"unknown mutants {unknown}; see --list")
    with tempfile.TemporaryDirectory(prefix="comlrl-mutants-") as copy:
        copy_repository(copy)
        check_import(copy)
        start = time.monotonic()
        clean = run_tests(copy, args.tests, args.timeout)
        if clean.returncode != 0:
            print(clean.stdout[-3000:], clean.stderr[-3000:])
            raise SystemExit("the unmutated copy fails its tests; fix that first")
        print(f"unmutated: passed ({time.monotonic() - start:.0f} s): {summary_line(clean)}")
        survivors = []
        for mutant in chosen:
            original = apply(copy, mutant)
            start = time.monotonic()
            try:
                done = run_tests(copy, args.tests, args.timeout)
            finally:
                with open(os.path.join(copy, mutant.path), "w", encoding="utf-8") as handle:
                    handle.write(original)
            killed = done.returncode == 1  # 1: tests failed; anything else is an error, not a kill
            if not killed:
                survivors.append(mutant.name)
            status = "killed" if killed else ("SURVIVED" if done.returncode == 0 else f"ERROR rc={done.returncode}")
            print(f"{mutant.name:40s} {status:9s} {time.monotonic() - start:4.0f} s  {summary_line(done)}", flush=True)
    print(f"{len(chosen) - len(survivors)}/{len(chosen)} mutants killed" + (f"; not killed: {survivors}" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
