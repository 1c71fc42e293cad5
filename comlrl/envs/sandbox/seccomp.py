"""The candidate's seccomp filter: a classic-BPF deny list that bubblewrap loads (``--seccomp FD``).

A candidate needs computation, memory, files in its tmpfs and its two pipes; it never needs to
trace processes, read other address spaces, load BPF programs, open perf events, fault pages in
user space, set up io_uring, touch keyrings, mount anything, enter or make namespaces, load kernel
modules, reboot, swap, account, read the kernel log, change personality or the clock. These system
calls fail with EPERM, whatever the candidate's privileges (most would already fail for uid 65534
without capabilities; the filter also takes away the kernel code behind them, the usual route of a
kernel exploit). A system call from another ABI (i386 or x32 on x86-64) kills the process, so the
list cannot be sidestepped by number.

Sockets: ``socket`` and ``socketpair`` fail with EPERM for every address family. No job needs one
(the harness talks over inherited pipes, and the harness's audit hook already refuses sockets to
Python code, so ``asyncio`` and ``multiprocessing`` do not run there either); the private network
namespace isolates IPv4, IPv6 and abstract unix sockets, but not every family -- ``AF_VSOCK``
reaches the host of a virtual machine -- and each family is kernel code a candidate could probe
(netlink, packet, the unix garbage collector, Bluetooth, CAN, TIPC, RDS, XDP, ALG ...). Denying
the two calls takes all of them away at once, ``AF_UNIX`` included.

Tables for x86-64 and AArch64 (numbers from the kernel's ``unistd_64.h`` / ``asm-generic/unistd.h``);
on any other architecture ``program()`` is None and the sandbox records that it runs without one.
"""

from __future__ import annotations

import platform
import struct
from typing import Dict, List, Optional, Tuple

DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key",
    "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "unshare", "setns", "chroot", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct", "syslog", "quotactl",
    "open_by_handle_at", "name_to_handle_at", "personality", "vhangup", "settimeofday", "clock_settime",
    "adjtimex", "clock_adjtime", "lookup_dcookie", "socket", "socketpair", "iopl", "ioperm", "uselib",
)
_X86_64 = dict(zip(DENIED, (
    101, 310, 311, 321, 298, 323, 425, 426, 427, 250, 248, 249, 165, 166, 155, 429, 428, 430, 431, 432, 433,
    442, 272, 308, 161, 246, 320, 175, 313, 176, 169, 167, 168, 163, 103, 179, 304, 303, 135, 153, 164, 227,
    159, 305, 212, 41, 53, 172, 173, 134,
)))
_AARCH64 = dict(zip(DENIED[:-3], (
    117, 270, 271, 280, 241, 282, 425, 426, 427, 219, 217, 218, 40, 39, 41, 429, 428, 430, 431, 432, 433,
    442, 97, 268, 51, 104, 294, 105, 273, 106, 142, 224, 225, 89, 116, 60, 265, 264, 92, 58, 170, 112,
    171, 266, 18, 198, 199,
)))
# machine -> (AUDIT_ARCH_* of the native ABI, syscall table, numbers at or above this are another ABI)
ARCHES: Dict[str, Tuple[int, Dict[str, int], Optional[int]]] = {
    "x86_64": (0xC000003E, _X86_64, 0x40000000),
    "aarch64": (0xC00000B7, _AARCH64, None),
}
_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO_EPERM = 0x7FFF0000, 0x80000000, 0x00050001
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: Optional[str] = None) -> Optional[bytes]:
    """The filter for ``machine`` (default: this one), or None where there is no table."""
    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, table, foreign_from = arch
    numbers = sorted(set(table.values()))
    head: List[bytes] = [_insn(_LD_ABS, _ARCH), _insn(_JEQ, audit_arch, jt=1), _insn(_RET, _KILL_PROCESS), _insn(_LD_ABS, _NR)]
    checks = [("jge", foreign_from)] if foreign_from is not None else []
    checks += [("jeq", number) for number in numbers]
    body = []
    for index, (kind, value) in enumerate(checks):
        to_deny = len(checks) - index  # skip the rest of the checks and the allow
        if kind == "jge":
            body.append(_insn(_JGE, value, jt=to_deny + 1))  # another ABI: to the kill after the deny
        else:
            body.append(_insn(_JEQ, value, jt=to_deny))
    tail = [_insn(_RET, _ALLOW), _insn(_RET, _ERRNO_EPERM), _insn(_RET, _KILL_PROCESS)]
    return b"".join(head + body + tail)


def describe(machine: Optional[str] = None) -> str:
    name = machine or platform.machine()
    if name not in ARCHES:
        return f"none (no system-call table for {name})"
    return (f"{len(ARCHES[name][1])} system calls denied (ptrace, bpf, userfaultfd, io_uring, keyctl, mount, namespaces, "
            f"socket and socketpair of every family ...); other ABIs killed")
