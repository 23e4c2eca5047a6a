"""ipc's pieced messages on ONE GPU: two processes, both on cuda:0 (mailbox.one_node bypassed), gloo for the
host-side collectives. Both directions at once, pieced (>= PIECE_MIN_BYTES, odd tail) and whole messages,
contiguous and strided receives, several rounds; the receiver checks every byte. Not a timing."""
import json, os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class Ctx:
    def __init__(self, rank, world):
        self.rank, self.world_size, self.is_cuda, self.backend = rank, world, True, "gloo"
        self.device = torch.device("cuda", 0)

    def barrier(self):
        dist.barrier()

    def sync(self):
        torch.cuda.synchronize(0)


def run(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.set_device(0)
    from kit.transports import ipc, ipc_direct, mailbox
    mailbox.one_node = lambda ctx, name: None
    ctx = Ctx(rank, world)
    rows = []
    for Tcls in (ipc.IpcTransport, ipc_direct.IpcDirectTransport):
        rows += one(Tcls(ctx, timeout_s=60, slots=2), rank, ipc)
    json.dump(rows, open(f"{out}.{rank}", "w"))
    dist.destroy_process_group()


def one(T, rank, ipc):
    big = ipc.PIECE_MIN_BYTES + 4 * 1001
    T.setup([(0, 1), (1, 0)], big)
    peer = 1 - rank
    rows = []
    name = T.name
    for rnd in range(6):
        for n, strided in ((big, False), (big, True), (4099 * 4, False), (ipc.PIECE_MIN_BYTES * 2 // 3, False)):
            n = min(n, big)
            elems = n // 4
            g = torch.Generator(device="cuda:0").manual_seed(1000 * rnd + 10 * rank + n % 97)
            x = torch.randn(elems, generator=g, device="cuda:0")
            if strided:
                o = torch.empty(2 * elems, device="cuda:0")[::2]
            else:
                o = torch.empty(elems, device="cuda:0")
            ws = T.exchange([("send", x, peer), ("recv", o, peer)])
            for w in ws:
                w.wait()
            torch.cuda.synchronize(0)
            g2 = torch.Generator(device="cuda:0").manual_seed(1000 * rnd + 10 * peer + n % 97)
            want = torch.randn(elems, generator=g2, device="cuda:0")
            rows.append(dict(transport=name, rank=rank, round=rnd, bytes=n, strided=strided, pieces=len(ipc.pieces(n)),
                             ok=bool(torch.equal(o, want))))
    # a receive of another size than sent: one clear error on the receiver
    x = torch.zeros(1024, device="cuda:0")
    if name != "ipc":
        pass
    elif rank == 0:
        T.isend(x, 1).wait()
    else:
        try:
            T.irecv(torch.empty(1000, device="cuda:0"), 0).wait()
            rows.append(dict(transport=name, rank=rank, round="size mismatch", ok=False, error=None))
        except ValueError as e:
            rows.append(dict(transport=name, rank=rank, round="size mismatch", ok="sent 4096 B, receiving into 4000 B" in str(e),
                             error=str(e)))
    torch.cuda.synchronize(0)
    dist.barrier()
    T.close()
    return rows


if __name__ == "__main__":
    out = sys.argv[1]
    mp.spawn(run, args=(2, 29561, out), nprocs=2, join=True)
    rows = json.load(open(out + ".0")) + json.load(open(out + ".1"))
    json.dump(rows, open(out, "w"), indent=1)
    bad = [r for r in rows if not r["ok"]]
    print({t: sum(r.get("transport") == t for r in rows) for t in ("ipc", "ipc-direct")})
    print(len(rows), "messages checked;", "all intact" if not bad else f"CORRUPT: {bad[:4]}")
    print("pieced:", sum(r.get("pieces", 0) > 1 for r in rows), "whole:", sum(r.get("pieces") == 1 for r in rows))
    print([r for r in rows if r["round"] == "size mismatch"])
