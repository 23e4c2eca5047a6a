"""The copy transport's pipeline path on ONE GPU: every stage on cuda:0, endpoints taken from the stage threads
(drive_threads names them stage<i>) instead of device indices, everything else the transport's own code
(_copy with the receive stream, events, record_stream, CommStreams). Checks the loss and gradients against one
process without a pipeline and that nothing hangs; 2 and 4 stages, separate and shared comm streams. Not a timing."""
import json, sys, threading, time
from collections import deque
import torch
from kit import transports
from kit.investigations.p2p_transports import pipeline as P

Copy = transports.get("copy")


def me():
    return int(threading.current_thread().name.removeprefix("stage"))


class OneGpuCopy(Copy):
    def device(self, e):
        return torch.device("cuda", 0)

    def isend(self, t, dst):
        s = torch.cuda.current_stream(0)
        from kit.transports.base import flat_bytes
        from kit.transports.copy import _Msg
        msg = _Msg(t, flat_bytes(t), self._events.record(s), s)
        with self._cv:
            self._box.setdefault((me(), dst), deque()).append(msg)
            self.posted += 1
            self._cv.notify_all()
        return self._send_work(msg, 0)

    def irecv(self, out, src, stream=None):
        with self._cv:
            msg = self._box[(src, me())].popleft()
        return self._copy(msg, out, 0, 0, stream)


class Ctx:
    rank, world_size, is_cuda, backend = 0, 1, True, "nccl"
    device = torch.device("cuda", 0)


out = []
for n in (2, 4):
    for sep in (True, False):
        T = OneGpuCopy(Ctx(), timeout_s=30)
        layers, hidden, batch, m = 2, 256, 64, 8
        stages = [P.Stage(s, n, layers, hidden, batch, m, torch.device("cuda", 0), torch.float32) for s in range(n)]
        comm = P.CommStreams.make([0], separate=sep)
        for it in range(3):
            for st in stages:
                st.zero_grad()
            progs = [st.iteration(T, s - 1 if s else None, s + 1 if s < n - 1 else None, comm) for s, st in enumerate(stages)]
            t0 = time.perf_counter()
            P.drive_threads(progs, T, [st.device for st in stages])
            torch.cuda.synchronize(0)
            dt = time.perf_counter() - t0
        loss, grads = P.reference(n, layers, hidden, batch, m, device="cuda:0")
        err = max(float((w.grad - g).abs().max()) for st, gs in zip(stages, grads) for w, g in zip(st.weights, gs))
        scale = max(float(g.abs().max()) for gs in grads for g in gs)
        r = dict(stages=n, driver="threads", separate_streams=sep, loss=float(stages[-1].loss), ref_loss=loss,
                 max_grad_err=err, grad_scale=scale, last_iter_s=dt, posted=T.posted,
                 ok=abs(float(stages[-1].loss) - loss) <= 1e-5 * abs(loss) and err <= 1e-4 * scale)
        print(r, flush=True)
        out.append(r)
json.dump(out, open(sys.argv[1], "w"), indent=1)
print("all ok" if all(r["ok"] for r in out) else "MISMATCH")

# copy's exchange with several receives in one call (a side stream per op, SideStreams): two messages through one
# GPU's (0, 0) box, received in order
T = Copy(Ctx(), timeout_s=30)
a, b = torch.randn(1 << 20, device="cuda:0"), torch.randn(4099, device="cuda:0")
oa, ob = torch.empty_like(a), torch.empty(2 * 4099, device="cuda:0")[::2]
for w in T.exchange([("send", a, 0), ("send", b, 0), ("recv", oa, 0), ("recv", ob, 0)]):
    w.wait()
torch.cuda.synchronize(0)
ok = bool(torch.equal(oa, a) and torch.equal(ob, b))
print("copy exchange with side streams:", "intact" if ok else "CORRUPT")
json.dump(out + [dict(case="exchange side streams", ok=ok)], open(sys.argv[1], "w"), indent=1)
