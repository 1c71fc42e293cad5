"""Containment under bubblewrap: file system, secrets, network, processes and resources, hook on and off.

Each attack is an ``add`` completion that answers right only when it believes it escaped
(``attacks.escape_main``); all of them, with their wrong twins and an honest completion, are scored
in one ``reward_func`` call (the sandbox's parallel runner). Each test then asserts that the
hostile reward is no higher than its twin's and that the host canaries it aimed at are unchanged.
Most attacks run with the audit hook switched off (``hook=False``): the namespaces, the uid and
the limits must contain them by themselves. Runs only where bubblewrap is installed; the ``none``
level offers no containment, so these attacks are never aimed at it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from comlrl.envs import get_environment
from comlrl.envs.sandbox import HARNESS

from tests.helpers.sandbox_attacks import Attack, Host, escape_main, score_batch, wait_for_no_survivors, with_host

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap")

FS = {
    "fs_write_outside": "def attack():\n    open(H['root'] + '/escape-a', 'w').write('x')\n    return True",
    "fs_chdir_root_relative_write": (
        "import os\ndef attack():\n    os.chdir('/')\n    rel = H['root'].lstrip('/')\n    hit = False\n"
        "    for path in (rel + '/escape-b', 'tmp/escape-b', 'var/tmp/escape-b'):\n        try:\n"
        "            open(path, 'w').write('x')\n            hit = hit or not os.path.realpath(path).startswith('/sandbox')\n"
        "        except OSError:\n            pass\n    return hit"),
    "fs_delete_outside": (
        "import os, shutil\ndef attack():\n    for f in (lambda: os.remove(H['root'] + '/precious.txt'), lambda: shutil.rmtree(H['root'])):\n"
        "        try:\n            f()\n        except OSError:\n            pass\n    return not os.path.exists(H['root'] + '/precious.txt') and os.path.exists(H['root'])"),
    "fs_dir_fd_open_and_unlink": (
        "import os\ndef attack():\n    fd = os.open(H['root'], os.O_RDONLY | os.O_DIRECTORY)\n"
        "    os.close(os.open('escape-c', os.O_CREAT | os.O_WRONLY, dir_fd=fd))\n    os.unlink('precious.txt', dir_fd=fd)\n    return True"),
    "fs_hard_link_then_write": (
        "import os\ndef attack():\n    os.link(H['root'] + '/precious.txt', 'mine')\n    open('mine', 'w').write('pwned')\n    return True"),
    "fs_fchmod_chown_outside": (
        "import os\ndef attack():\n    fd = os.open(H['root'] + '/precious.txt', os.O_RDONLY)\n    os.fchmod(fd, 0o777)\n"
        "    os.chown(H['root'] + '/precious.txt', 65534, 65534)\n    return True"),
    "fs_mkfifo_mknod_outside": (
        "import os, stat\ndef attack():\n    ok = False\n    for f in (lambda: os.mkfifo(H['root'] + '/escape-d'),\n"
        "              lambda: os.mknod(H['root'] + '/escape-e', stat.S_IFCHR | 0o666, os.makedev(1, 3)),\n"
        "              lambda: os.mknod('null2', stat.S_IFCHR | 0o666, os.makedev(1, 3))):\n        try:\n            f()\n            ok = True\n"
        "        except OSError:\n            pass\n    return ok"),
    "fs_symlink_out_of_workdir": (
        "import os\ndef attack():\n    os.symlink(H['root'], 'link')\n    open('link/escape-f', 'w').write('x')\n    return True"),
    "fs_proc_sys_and_sysrq_writable": (
        "import os\ndef attack():\n    for path in ('/proc/sys/vm/drop_caches', '/proc/sys/kernel/core_pattern', '/proc/sysrq-trigger', '/sys/kernel/uevent_helper'):\n"
        "        try:\n            os.close(os.open(path, os.O_WRONLY))\n            return True\n        except OSError:\n            pass\n    return False"),
    "fs_remount_and_new_user_namespace": (
        "import ctypes\ndef attack():\n    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    remount = libc.mount(b'none', b'/usr', None, 0x20 | 0x1000, None) == 0\n"
        "    userns = libc.unshare(0x10000000) == 0\n    return remount or userns"),
    "fs_chattr_immutable_workdir": (
        "import fcntl, os\ndef attack():\n    open('locked', 'w').write('x')\n    fd = os.open('locked', os.O_RDONLY)\n"
        "    fcntl.ioctl(fd, 0x40086602, (0x10).to_bytes(4, 'little'))\n    return True"),
    "fs_overwrite_the_harness": (
        "import os\ndef attack():\n    for path in (H['repo'] + '/comlrl/envs/sandbox/checker.py', '/opt/comlrl-sandbox/checker.py', '/opt/comlrl-sandbox/wire.py'):\n"
        "        try:\n            open(path, 'a').write('# pwned')\n            return True\n        except OSError:\n            pass\n    return False"),
    "fs_dev_shm_and_usr_writable": (
        "def attack():\n    for path in ('/dev/shm/escape', '/dev/escape', '/usr/escape', '/escape'):\n        try:\n"
        "            open(path, 'w').write('x')\n            return True\n        except OSError:\n            pass\n    return False"),
}

SECRETS = {
    "secret_environment": (
        "import os\ndef attack():\n    return H['secret_value'] in repr(dict(os.environ))"),
    "secret_proc_environ_of_every_visible_process": (
        "import os\ndef attack():\n    for pid in ['self', '1', str(os.getppid()), str(H['trainer'])] + os.listdir('/proc'):\n"
        "        for name in ('environ', 'cmdline'):\n            try:\n"
        "                if H['secret_value'].encode() in open('/proc/%s/%s' % (pid, name), 'rb').read():\n                    return True\n"
        "            except OSError:\n                pass\n    return False"),
    "secret_trainer_memory": (
        "def attack():\n    for pid in (H['trainer'], 1):\n        try:\n            maps = open('/proc/%d/maps' % pid).read()\n"
        "            mem = open('/proc/%d/mem' % pid, 'rb')\n            return bool(maps) and mem is not None\n        except OSError:\n            pass\n    return False"),
    "secret_process_vm_readv": (
        "import ctypes\ndef attack():\n    libc = ctypes.CDLL(None, use_errno=True)\n    buf = ctypes.create_string_buffer(64)\n"
        "    class iov(ctypes.Structure):\n        _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"
        "    local, remote = iov(ctypes.addressof(buf), 64), iov(0x400000, 64)\n"
        "    return libc.process_vm_readv(H['trainer'], ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) > 0"),
    "secret_home_files": (
        "import os\ndef attack():\n    for path in (H['home'] + '/.netrc', H['secret_path'], os.path.expanduser('~/.netrc'), '/root/.netrc',\n"
        "                 '/root/.cache/huggingface/token', '/etc/shadow', '/etc/passwd'):\n        try:\n"
        "            if H['secret_value'] in open(path).read() or path.startswith('/etc'):\n                return True\n"
        "        except OSError:\n            pass\n    return False"),
    "secret_bundled_dataset_and_repository": (
        "import os\ndef attack():\n    for path in (H['data'], H['repo'] + '/pyproject.toml', H['repo'] + '/comlrl/envs/data/mbpp.json'):\n"
        "        if os.path.exists(path):\n            return True\n    return False"),
    "secret_ptrace_attach": (
        "import ctypes\ndef attack():\n    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    return any(libc.ptrace(16, pid, 0, 0) == 0 for pid in (H['trainer'], H['sentinel'], 1))"),
}

NETWORK = {
    "net_tcp_ipv4_loopback": (
        "import socket\ndef attack():\n    s = socket.create_connection(('127.0.0.1', H['tcp4']), timeout=1)\n    s.sendall(b'net_tcp_ipv4_loopback')\n    return True"),
    "net_tcp_ipv6_loopback": (
        "import socket\ndef attack():\n    s = socket.create_connection(('::1', H['tcp6']), timeout=1)\n    s.sendall(b'net_tcp_ipv6_loopback')\n    return True"),
    "net_udp_ipv4_datagram": (
        "import socket\ndef attack():\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "    for _ in range(3):\n        s.sendto(b'net_udp_ipv4_datagram', ('127.0.0.1', H['udp4']))\n    return False  # no reply to tell: the canary decides"),
    "net_unix_path_socket": (
        "import socket\ndef attack():\n    s = socket.socket(socket.AF_UNIX)\n    s.connect(H['unix'])\n    s.sendall(b'net_unix_path_socket')\n    return True"),
    "net_abstract_unix_socket": (
        "import socket\ndef attack():\n    s = socket.socket(socket.AF_UNIX)\n    s.connect('\\0' + H['abstract'])\n    s.sendall(b'net_abstract_unix_socket')\n    return True"),
    "net_host_daemon_sockets": (
        "import socket\ndef attack():\n    for path in ('/run/docker.sock', '/var/run/docker.sock', '/run/dbus/system_bus_socket', '/tmp/.X11-unix/X0', '/run/systemd/private'):\n"
        "        try:\n            socket.socket(socket.AF_UNIX).connect(path)\n            return True\n        except OSError:\n            pass\n    return False"),
    "net_every_address_family": (
        "import socket\ndef attack():\n    for family in range(64):\n        for kind in (1, 2, 3, 5):\n            try:\n"
        "                socket.socket(family, kind).close()\n                return True\n            except OSError:\n                pass\n"
        "        try:\n            socket.socketpair(family, 1)\n            return True\n        except OSError:\n            pass\n    return False"),
    "net_vsock_to_the_host": (
        "import socket\ndef attack():\n    s = socket.socket(40, socket.SOCK_STREAM)\n    try:\n        s.connect((2, 22))\n"
        "    except OSError:\n        pass\n    return True  # a VSOCK socket exists at all"),
    "net_raw_socket_and_interfaces": (
        "import socket\ndef attack():\n    try:\n        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\n        return True\n"
        "    except OSError:\n        pass\n    return any(name != 'lo' for _, name in socket.if_nameindex())"),
}

SURVIVOR = ("import os, sys, time\ndef spawn(tag, setsid=False, pdeathsig=False):\n    if os.fork() == 0:\n"
            "        if setsid:\n            os.setsid()\n        if pdeathsig:\n            import ctypes\n            ctypes.CDLL(None).prctl(1, 0)\n"
            "        if os.fork() == 0:\n            import signal\n            for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
            "                signal.signal(s, signal.SIG_IGN)\n"
            "            os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)', 'comlrl-survivor-%d-%s' % (H['trainer'], tag)])\n"
            "        os._exit(0)\n    time.sleep(0.2)\n")
PROCESS = {
    "proc_double_fork_survivor": SURVIVOR + "def attack():\n    spawn('double')\n    return False",
    "proc_setsid_survivor": SURVIVOR + "def attack():\n    spawn('setsid', setsid=True)\n    return False",
    "proc_pdeathsig_cleared_survivor": SURVIVOR + "def attack():\n    spawn('pdeath', setsid=True, pdeathsig=True)\n    return False",
    "proc_shell_background_survivor": (
        "import subprocess, time\ndef attack():\n    subprocess.Popen(['/bin/sh', '-c', '( sleep 120; : ) & exit 0', 'comlrl-survivor-%d-shell' % H['trainer']], start_new_session=True)\n"
        "    time.sleep(0.2)\n    return False"),
    "proc_kill_parent_and_everyone": (
        "import os, signal\ndef attack():\n    for target in (H['trainer'], H['sentinel'], os.getppid(), -1):\n        try:\n"
        "            os.kill(target, signal.SIGKILL)\n        except OSError:\n            pass\n    return False"),
    "proc_pidfd_send_signal": (
        "import ctypes\ndef attack():\n    libc = ctypes.CDLL(None, use_errno=True)\n    for pid in (H['trainer'], H['sentinel']):\n"
        "        fd = libc.syscall(434, pid, 0)\n        if fd >= 0 and libc.syscall(424, fd, 9, None, 0) == 0:\n            return True\n    return False"),
    "proc_sees_host_processes": (
        "import os\ndef attack():\n    for pid in os.listdir('/proc'):\n        try:\n"
        "            if b'comlrl-sentinel' in open('/proc/%s/cmdline' % pid, 'rb').read():\n                return True\n"
        "        except OSError:\n            pass\n    return str(H['trainer']) in os.listdir('/proc') and os.path.exists('/proc/%d/cmdline' % H['trainer'])"),
    "proc_kernel_attack_surface": (
        "import ctypes\ndef attack():\n    libc = ctypes.CDLL(None, use_errno=True)\n    libc.syscall.restype = ctypes.c_long\n"
        "    buf = ctypes.create_string_buffer(128)\n    ctypes.memmove(buf, bytes([1, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0]), 16)\n"
        "    calls = [(323, 1), (425, 1, buf), (321, 0, buf, 128), (250, 0, ctypes.c_long(-4), 0), (298, buf, 0, -1, -1, 0),\n"
        "             (135, ctypes.c_ulong(0xffffffff)), (101, 0, 0, 0, 0)]  # userfaultfd io_uring bpf keyctl perf personality ptrace\n"
        "    return any(libc.syscall(*call) >= 0 for call in calls)"),
    "proc_identity_root_or_capabilities": (
        "import os\ndef attack():\n    status = open('/proc/self/status').read()\n    caps = [l.split()[1] for l in status.splitlines() if l.startswith('CapEff')][0]\n"
        "    nnp = [l.split()[1] for l in status.splitlines() if l.startswith('NoNewPrivs')][0]\n"
        "    return os.getuid() == 0 or os.geteuid() == 0 or int(caps, 16) != 0 or nnp != '1' or bool(os.getgroups())"),
}

RESOURCES = {
    "res_fork_bomb": (
        "import os\ndef attack():\n    children = 0\n    try:\n        for _ in range(200):\n            if os.fork() == 0:\n"
        "                import time\n                time.sleep(30)\n                os._exit(0)\n            children += 1\n    except OSError:\n        pass\n    return children > 40"),
    "res_thread_bomb": (
        "import threading, time\ndef attack():\n    started = 0\n    try:\n        for _ in range(500):\n"
        "            threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n            started += 1\n    except RuntimeError:\n        pass\n    return started > 40"),
    "res_memory_8_gib": "def attack():\n    hog = bytearray(8 << 30)\n    return len(hog) > 0",
    "res_raise_own_limits": (
        "import resource\ndef attack():\n    ok = False\n    for which in (resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_CPU, resource.RLIMIT_NOFILE):\n"
        "        try:\n            resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n            ok = True\n"
        "        except (ValueError, OSError):\n            pass\n    return ok"),
    "res_fill_the_disk": (
        "import os\ndef attack():\n    written = 0\n    chunk = b'x' * (1 << 20)\n    try:\n        for i in range(200):\n"
        "            with open('fill-%d' % i, 'wb') as f:\n                f.write(chunk * 8)\n            written += 8 << 20\n"
        "    except OSError:\n        pass\n    return written > (80 << 20)"),
    "res_file_descriptors": (
        "import os\ndef attack():\n    fds = []\n    try:\n        for _ in range(5000):\n            fds.append(os.open('/dev/null', os.O_RDONLY))\n"
        "    except OSError:\n        pass\n    return len(fds) > 100"),
    "res_output_flood": (
        "import os\ndef attack():\n    block = b'y' * (1 << 20)\n    for _ in range(64):\n        os.write(1, block)\n        os.write(2, block)\n    return False"),
}

SLOW = {
    "res_swallowed_alarm_busy_loop": (
        "import signal\ndef attack():\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n    while True:\n        pass"),
    "res_uninterruptible_c_loop": "def attack():\n    return sum(range(10 ** 13)) > 0",
}


def _attacks(host: Host):
    out = []
    for group, hook_variants in ((FS, (True, False)), (SECRETS, (False,)), (NETWORK, (False,)), (PROCESS, (False,)),
                                 (RESOURCES, (False,)), (SLOW, (False,))):
        for name, source in group.items():
            for hook in hook_variants:
                out.append(Attack(name + ("" if hook else "_nohook"), name.split("_")[0], escape_main(with_host(source, host), hook=hook),
                                  slow=group is SLOW))
    out.append(Attack("fs_write_outside_at_load_nohook", "fs", escape_main(with_host(FS["fs_write_outside"], host), hook=False, at_load=True)))
    return out


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    host = Host.start(str(tmp_path_factory.mktemp("host")), secret="sk-comlrl-canary-5e1f0c")
    yield host
    host.close()


@pytest.fixture(scope="module")
def scored(host):
    """Every attack, twin and one honest completion in one batch (two agents, aux defined)."""
    before = {name for name in os.listdir("/tmp") if name.startswith("comlrl-sandbox-")}
    os.environ["COMLRL_CANARY_SECRET"] = host.secret  # the trainer's own secret, in its environment
    try:
        env = get_environment("humaneval", num_turns=1, isolation="bwrap", test_timeout_s=1.0, max_timeouts=2, wall_time_s=12.0)
        honest = Attack("honest", "honest", "def add(a, b):\n    return a + b")
        results = score_batch(env, _attacks(host) + [honest], two_agents=True)
    finally:
        del os.environ["COMLRL_CANARY_SECRET"]
    left = {name for name in os.listdir("/tmp") if name.startswith("comlrl-sandbox-")} - before
    return results, wait_for_no_survivors(host), left


ALL_IDS = (
    [f"{n}{s}" for n in FS for s in ("", "_nohook")] + ["fs_write_outside_at_load_nohook"]
    + [f"{n}_nohook" for group in (SECRETS, NETWORK, PROCESS, RESOURCES, SLOW) for n in group]
)


def test_the_suite_is_large_enough():
    assert len(ALL_IDS) >= 40


@pytest.mark.parametrize("attack_id", ALL_IDS)
def test_attack_is_contained(attack_id, host, scored):
    results, survivors, _ = scored
    assert set(results) == set(ALL_IDS) | {"honest"}
    hostile, twin = results[attack_id]
    # an honest batch mate still scores 2.5 (0.4 + 0.6 + 0.5 + 4/4; main does not call aux)
    assert results["honest"][0] == pytest.approx(2.5)
    assert twin == pytest.approx(1.75)  # a - b passes add(0, 0) only: 0.4 + 0.6 + 0.5 + 1/4
    assert hostile <= twin, f"{attack_id} scored {hostile} > {twin}: the attack got through"
    # the host canaries
    assert host.changes() == [], f"files outside the sandbox changed: {host.changes()}"
    assert open(os.path.join(host.root, "precious.txt")).read() == "years of work"
    assert host.received() == {}, f"a host socket received data: {host.received()}"
    assert host.sentinel_ok(), "the sentinel process was killed or traced"
    assert survivors == [], f"processes outlived their job: {survivors}"
    assert subprocess.run(["true"]).returncode == 0  # the trainer can still start processes
    harness = open(HARNESS).read()
    assert "# pwned" not in harness


def test_no_job_directory_is_left_on_the_host(scored):
    assert scored[2] == set()  # bubblewrap jobs have no host directory at all: their work dir is a private tmpfs
