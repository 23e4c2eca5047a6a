"""kitrun's sampler (device runs only; on PYTHONPATH only for the pytest runs that set KITRUN_STACKS): every Python
process started under it samples all its threads' stacks every KITRUN_STACKS_S seconds from a daemon thread
(sys._current_frames, under the GIL: a forked child has no sampler thread and inherits nothing half-done) into
KITRUN_STACKS/stacks-<pid>.txt -- where the time of a slow test goes."""
import os

_d = os.environ.get("KITRUN_STACKS")
if _d:
    import sys
    import threading
    import time

    def _sample(path, interval):
        pid = os.getpid()
        with open(path, "w") as f:
            f.write(f"# pid {pid} ppid {os.getppid()} argv {' '.join(sys.argv)[:200]}\n")
            while True:
                time.sleep(interval)
                if os.getpid() != pid:  # never in a forked child (the thread does not survive fork anyway)
                    return
                me = threading.get_ident()
                lines = [f"@ {time.time():.3f}"]
                for tid, fr in sys._current_frames().items():
                    if tid == me:
                        continue
                    lines.append(f" T {tid}")
                    depth = 0
                    while fr is not None and depth < 40:
                        co = fr.f_code
                        lines.append(f"  {co.co_filename}:{fr.f_lineno} {co.co_name}")
                        fr, depth = fr.f_back, depth + 1
                f.write("\n".join(lines) + "\n")
                f.flush()

    def _start():
        threading.Thread(target=_sample, args=(os.path.join(_d, f"stacks-{os.getpid()}.txt"),
                                               float(os.environ.get("KITRUN_STACKS_S", "0.5"))),
                         name="kitrun-sampler", daemon=True).start()

    os.makedirs(_d, exist_ok=True)
    _start()
    os.register_at_fork(after_in_child=_start)  # a forked child (a DataLoader worker) gets its own sampler
