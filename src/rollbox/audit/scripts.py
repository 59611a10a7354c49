"""Probe programs run INSIDE a sandbox with the baseline's ``python3``.

Each is a self-contained script: it reads its arguments as JSON from stdin (never from the
environment or argv, where probes scanning /proc would find their own search tokens) and
prints one line ``RBX-AUDIT <json>`` with what it saw. Syscalls the standard library
does not wrap are made through ``ctypes`` (x86-64 numbers).
"""

from __future__ import annotations

PRELUDE = r"""
import ctypes, errno, json, os, socket, stat, sys, time
ARGS = json.loads(sys.stdin.read() or "{}")
def out(obj):
    sys.stdout.write("RBX-AUDIT " + json.dumps(obj) + "\n"); sys.stdout.flush()
def ename(n):
    return errno.errorcode.get(n, str(n)) if n else "OK"
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sysc(nr, *a):
    r = libc.syscall(ctypes.c_long(nr), *a)
    return r, (ctypes.get_errno() if r == -1 else 0)
def walk_find(names, roots=("/",), skip=("/proc", "/sys", "/dev")):
    hits = []
    for root in roots:
        for d, dirs, files in os.walk(root):
            if any(d == s or d.startswith(s + "/") for s in skip):
                dirs[:] = []; continue
            for f in files + dirs:
                if f in names: hits.append(os.path.join(d, f))
    return hits
"""


def program(body: str) -> str:
    """The prelude plus ``body``."""
    return PRELUDE + body


# Write marker files; used by cross-sandbox-files.
WRITE_FILES = program(r"""
done = []
for p in ARGS["paths"]:
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f: f.write(ARGS["token"])
    done.append(p)
out({"written": done})
""")

# Which of the given paths exist; plus a walk for file names.
EXISTS = program(r"""
seen = {p: os.path.lexists(p) for p in ARGS.get("paths", [])}
found = walk_find(set(ARGS.get("names", []))) if ARGS.get("names") else []
out({"exists": seen, "found_by_name": found})
""")

# Start a marker process that outlives this exec (setsid + double fork).
START_MARKER = program(r"""
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        fd = os.open("/dev/null", os.O_RDWR)
        for i in (0, 1, 2): os.dup2(fd, i)
        os.execvp("sleep", ["sleep", ARGS["seconds"]])
    os._exit(0)
os.waitpid(pid, 0)
mine, end = [], time.time() + 10  # the grandchild may take a while to exec (TCG guests)
while not mine and time.time() < end:
    time.sleep(0.1)
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cl = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            except OSError: continue
            if ARGS["seconds"] in cl: mine.append(int(p))
out({"marker_pids": mine})
""")

# List processes; look for tokens in cmdlines and environments; optionally kill pids.
SCAN_PROCS = program(r"""
toks = ARGS.get("tokens", [])
procs, env_hits, cmd_hits, readable = [], [], [], 0
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) == os.getpid(): continue
    try:
        cl = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError: continue
    procs.append([int(p), cl[:120]])
    if any(t in cl for t in toks): cmd_hits.append(int(p))
    try:
        env = open(f"/proc/{p}/environ", "rb").read().decode(errors="replace"); readable += 1
        if any(t in env for t in toks): env_hits.append(int(p))
    except OSError: pass
kills = {}
for pid in ARGS.get("kill", []):
    if pid in (os.getpid(), 1): continue
    try: os.kill(pid, 9); kills[pid] = "OK"
    except OSError as e: kills[pid] = ename(e.errno)
out({"processes": procs, "environ_readable": readable, "environ_hits": env_hits,
     "cmdline_hits": cmd_hits, "kills": kills, "self_env_has": [t for t in toks if t in
     "".join(f"{k}={v}" for k, v in os.environ.items())]})
""")

# Append to / replace / delete baseline files and add a new one.
MUTATE_BASELINE = program(r"""
res = {}
for p in ARGS["append"]:
    try:
        with open(p, "a") as f: f.write("\n# rbx-audit was here\n")
        res[p] = "appended"
    except OSError as e: res[p] = ename(e.errno)
for p in ARGS["delete"]:
    try: os.unlink(p); res[p] = "deleted"
    except OSError as e: res[p] = ename(e.errno)
with open(ARGS["new"], "w") as f: f.write("new")
res[ARGS["new"]] = "created"
out({"result": res})
""")

HASH_FILES = program(r"""
import hashlib
h = {}
for p in ARGS["paths"]:
    try: h[p] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    except OSError as e: h[p] = ename(e.errno)
out({"sha256": h})
""")

FORK_BOMB = program(r"""
kids, err = [], None
for i in range(ARGS.get("max", 4000)):
    try: pid = os.fork()
    except OSError as e: err = ename(e.errno); break
    if pid == 0:
        time.sleep(30); os._exit(0)
    kids.append(pid)
for k in kids:
    try: os.kill(k, 9)
    except OSError: pass
for k in kids:
    try: os.waitpid(k, 0)
    except OSError: pass
out({"forked": len(kids), "error": err})
""")

DISK_FILL = program(r"""
path, want = ARGS["path"], ARGS["mb"]
written, err = 0, None
chunk = b"\0" * (1 << 20)
try:
    with open(path, "wb") as f:
        for i in range(want):
            f.write(chunk); written += 1
        f.flush(); os.fsync(f.fileno())
except OSError as e: err = ename(e.errno)
size = os.path.getsize(path) if os.path.exists(path) else 0
try: os.unlink(path)
except OSError: pass
out({"written_mb_attempted": written, "size": size, "error": err})
""")

NETWORK_NONE = program(r"""
ifaces = []
for line in open("/proc/net/dev").read().splitlines()[2:]:
    ifaces.append(line.split(":")[0].strip())
routes = [l for l in open("/proc/net/route").read().splitlines()[1:] if l.strip()]
conn = {}
for host, port in ARGS["targets"]:
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((host, port)); data = s.recv(200).decode(errors="replace")
        conn[f"{host}:{port}"] = "CONNECTED " + data.strip()
    except OSError as e: conn[f"{host}:{port}"] = ename(e.errno) if e.errno else str(e)
    finally: s.close()
out({"interfaces": ifaces, "routes": routes, "connect": conn})
""")

CONNECT = program(r"""
res = {}
for host, port in ARGS.get("tcp", []):
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((host, port))
        res[f"{host}:{port}"] = "CONNECTED " + s.recv(200).decode(errors="replace").strip()
    except OSError as e: res[f"{host}:{port}"] = ename(e.errno) if e.errno else str(e)
    finally: s.close()
for name in ARGS.get("abstract", []):
    s = socket.socket(socket.AF_UNIX); s.settimeout(3)
    try:
        s.connect("\0" + name)
        res["@" + name] = "CONNECTED " + s.recv(200).decode(errors="replace").strip()
    except OSError as e: res["@" + name] = ename(e.errno)
    finally: s.close()
out({"connect": res})
""")

MOUNTINFO = program(r"""
out({"mountinfo": open("/proc/self/mountinfo").read()})
""")

# fstat every fd without opening anything (listing /proc/self/fd would add one).
FDS = program(r"""
fds = {}
for fd in range(0, 4096):
    try: os.fstat(fd)
    except OSError: continue
    try: fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError as e: fds[fd] = "?" + ename(e.errno)
out({"fds": fds})
""")

# Unix sockets visible in the filesystem, and whether they accept a connection.
SOCKETS = program(r"""
paths = ARGS["paths"]
exists = {p: os.path.lexists(p) for p in paths}
socks = []
for d, dirs, files in os.walk("/"):
    if d.startswith(("/proc", "/sys")): dirs[:] = []; continue
    for f in files:
        p = os.path.join(d, f)
        try:
            if stat.S_ISSOCK(os.lstat(p).st_mode): socks.append(p)
        except OSError: pass
conn = {}
for p in socks:
    s = socket.socket(socket.AF_UNIX); s.settimeout(2)
    try: s.connect(p); conn[p] = "CONNECTED"
    except OSError as e: conn[p] = ename(e.errno)
    finally: s.close()
lines = open("/proc/net/unix").read().splitlines()[1:]
net_unix = [l.split()[-1] for l in lines if len(l.split()) >= 8]
out({"exists": exists, "sockets": conn, "proc_net_unix_paths": net_unix, "uid": os.getuid()})
""")

KILL_ALL = program(r"""
try: os.kill(-1, 9); r = "OK"
except OSError as e: r = ename(e.errno)
out({"kill_-1": r})
""")

# Attach to own child and pid 1 (released at once), then to the host pids given, holding
# those attachments for ARGS["hold"] seconds while the host reads their TracerPid.
PTRACE = program(r"""
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
res = {}
child = os.fork()
if child == 0:
    time.sleep(60); os._exit(0)
def attach(pid):
    r, e = sysc(101, ctypes.c_long(PTRACE_ATTACH), ctypes.c_long(pid), None, None)
    res[str(pid)] = ename(e)
    return r == 0
def detach(pid):
    sysc(101, ctypes.c_long(PTRACE_DETACH), ctypes.c_long(pid), None, None)
def same_mntns(pid):
    try: return os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
    except OSError: return True  # unreadable: the attach itself will be refused
for pid in (child, 1):
    # pid 1 only when it is this sandbox's own init (never stop a host's init)
    if pid == 1 and not same_mntns(1):
        res["1"] = "not attempted: pid 1 is outside this sandbox"; continue
    if attach(pid):
        time.sleep(0.05); detach(pid)
held = [pid for pid in ARGS.get("host_pids", []) if attach(int(pid))]
if held:
    time.sleep(ARGS.get("hold", 0))
    for pid in held: detach(pid)
os.kill(child, 9); os.waitpid(child, 0)
out({"attach": res, "child": child, "held": held})
""")

# Write a new value to each knob (host restores them if they changed there).
WRITE_KNOBS = program(r"""
res = {}
for p, value in ARGS["writes"]:
    try:
        with open(p, "w") as f: f.write(value)
        res[p] = "WROTE"
    except OSError as e: res[p] = ename(e.errno)
for p in ARGS.get("mkdirs", []):
    try: os.mkdir(p); res[p] = "MKDIR"; os.rmdir(p)
    except OSError as e: res[p] = ename(e.errno)
out({"result": res})
""")

MKNOD = program(r"""
res = {}
for name, kind, major, minor in ARGS["nodes"]:
    p = "/tmp/" + name
    mode = (stat.S_IFCHR if kind == "c" else stat.S_IFBLK) | 0o600
    try:
        os.mknod(p, mode, os.makedev(major, minor)); made = "OK"
    except OSError as e: made = ename(e.errno)
    readres = "not-made"
    if made == "OK":
        try:
            fd = os.open(p, os.O_RDONLY)
            try:
                if kind == "c" and (major, minor) == (1, 1):
                    os.lseek(fd, 0xF0000, 0)
                data = os.read(fd, 512); readres = f"READ {len(data)} bytes"
            finally: os.close(fd)
        except OSError as e: readres = ename(e.errno)
        os.unlink(p)
    res[name] = {"mknod": made, "open_read": readres}
out({"nodes": res})
""")

MOUNT = program(r"""
res = {}
os.makedirs("/tmp/rbx-mnt", exist_ok=True)
cp = ctypes.c_char_p
libc.mount.argtypes = [cp, cp, cp, ctypes.c_ulong, ctypes.c_void_p]
for label, src, fs, flags in [("tmpfs", b"none", b"tmpfs", 0), ("bind-root", b"/", None, 4096),
                               ("proc", b"proc", b"proc", 0)]:
    r = libc.mount(src, b"/tmp/rbx-mnt", fs, flags, None)
    e = ctypes.get_errno() if r != 0 else 0
    res[label] = ename(e)
    if r == 0: libc.umount2(b"/tmp/rbx-mnt", 2)
r, e = sysc(272, ctypes.c_long(0x00020000))  # unshare(CLONE_NEWNS)
res["unshare(CLONE_NEWNS)"] = ename(e)
out({"mount": res})
""")

KEYCTL = program(r"""
desc = ARGS["desc"].encode()
payload = ARGS["token"].encode()
r, e = sysc(248, ctypes.c_char_p(b"user"), ctypes.c_char_p(desc), ctypes.c_char_p(payload),
            ctypes.c_size_t(len(payload)), ctypes.c_long(-3))
res = {"add_key": ename(e), "key": r}
r2, e2 = sysc(250, ctypes.c_long(0), ctypes.c_long(-3), ctypes.c_long(0))  # KEYCTL_GET_KEYRING_ID
res["keyctl_get_keyring_id"] = ename(e2)
out(res)
""")

BPF = program(r"""
class Attr(ctypes.Structure):
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32),
                ("pad", ctypes.c_uint8 * 112)]
a = Attr(1, 4, 4, 1)
r, e = sysc(321, ctypes.c_long(0), ctypes.byref(a), ctypes.c_uint(ctypes.sizeof(a)))
if r >= 0: os.close(r)
out({"bpf_map_create": ename(e), "fd": r})
""")

TIOCSTI = program(r"""
import fcntl, glob
TIOCSTI = 0x5412
res = {}
fds = {"fd0": 0, "fd1": 1, "fd2": 2}
opened = []
ttys = sorted(glob.glob("/dev/pts/[0-9]*")) + sorted(glob.glob("/dev/tty[0-9]*"))[:4]
for p in ["/dev/tty", "/dev/console"] + ttys:
    try: fd = os.open(p, os.O_RDWR | os.O_NOCTTY); fds[p] = fd; opened.append(fd)
    except OSError as e: res[p] = "open " + ename(e.errno)
for name, fd in fds.items():
    try: fcntl.ioctl(fd, TIOCSTI, b"#"); res[name] = "INJECTED"
    except OSError as e: res[name] = ename(e.errno)
for fd in opened: os.close(fd)
out({"tiocsti": res, "isatty": {str(i): os.isatty(i) for i in (0, 1, 2)}})
""")

# Swap DIR/f between a file and symlinks out of the root for ARGS["seconds"].
SYMLINK_SWAPPER = program(r"""
d = ARGS["dir"]; os.makedirs(d, exist_ok=True)
f = os.path.join(d, "f"); tmp = os.path.join(d, ".t")
targets = ARGS["targets"]
end = time.time() + ARGS["seconds"]; n = 0
stop = os.path.join(d, "stop")
try: os.unlink(stop)
except FileNotFoundError: pass
with open(os.path.join(d, "benign"), "w") as fh: fh.write("benign\n")
while time.time() < end and not os.path.exists(stop):
    for t in [None] + targets:
        try: os.unlink(tmp)
        except FileNotFoundError: pass
        if t is None:
            with open(tmp, "w") as fh: fh.write("benign\n")
        else:
            os.symlink(t, tmp)
        os.rename(tmp, f); n += 1
        os.makedirs(d + "/sub", exist_ok=True)
        try: os.unlink(d + "/sub/link")
        except FileNotFoundError: pass
        os.symlink(targets[n % len(targets)], d + "/sub/link")
out({"swaps": n})
""")
