// graph_gaps reproducer (issue 31): does a CUDA graph of long kernels + tiny side-stream kernels followed by
// EXTERNAL event-record nodes idle more and more before each kernel along one replay?  CUDA runtime only (no
// PyTorch, no NCCL, no profiler).  Every kernel stamps its own start and end with %globaltimer.
//
// Per layer i (captured from stream s0; s1 is a side stream):
//   s0: busy_i (--busy: spin = spins work_us on every SM; copy = copies ~1.5 MB per us of work_us; gemm = cuBLAS
//       SGEMM 1024 x hidden x hidden, no TF32, after a one-thread stamp kernel that takes slot 2i) -- "the GEMM"
//       then, with --tail 1, an elementwise tanh over 2M floats (as torch.tanh(x @ w) has)
//   s1: waits for busy_i, tiny_i (1 thread)         -- "the collective"
//       then a record (--record):  none | internal (cudaEventRecord: an edge, no node) |
//       shared (cudaEventRecordWithFlags(E, s1, cudaEventRecordExternal): an EVENT_RECORD node of ONE event) |
//       distinct (the same, a different event E_i per layer) | node (cudaGraphAddEventRecordNode of the one event,
//       spliced into the capture as NCCL's ncclStrongStreamRelease does)
//   join (--join): edge (s0 waits for s1 through an internal event: busy_{i+1} depends on the record) |
//       extwait (s0 waits on E / E_i with cudaEventWaitExternal: an EVENT_WAIT node) | none (s1 joins s0 once, at the end)
//   --where main puts tiny_i and the record on s0 itself (no side stream).
// A last 'tick' kernel advances the replay counter that every kernel reads to find its stamp slot.
// Gap of a kernel = its start - the latest end of any kernel that started before it (all streams).
//
// --pdl 1 launches busy_i with programmatic stream serialization (PDL, cudaLaunchKernelEx); --pdl 2 adds after busy_i
// a short 'reduce' kernel on every SM launched so (as cuBLASLt's split-K reduce is); --pdl 3 both.
// --autofree 1 instantiates with cudaGraphInstantiateFlagAutoFreeOnLaunch (PyTorch's flag), --priority 1 with
// cudaGraphInstantiateFlagUseNodePriority (side stream at the greatest priority; --priority 2: the flag alone, as
// PyTorch instantiates), --upload 1 uploads first. --launch legacy replays into the legacy default stream (stream 0,
// where PyTorch replays unless a stream is current) instead of the created non-blocking stream s0; --launch per_thread
// into the per-thread default stream (cudaStreamPerThread), --launch blocking into a stream made by cudaStreamCreate
// (both blocking streams: they synchronise with the legacy stream, but are not it).
// Where the legacy launch's growth sits (all off by default, the graph and its stamps unchanged without them):
// --post 1 puts a one-thread stamp kernel post_i on the side stream right after the record (the join then follows
// it) and prints, by quarter, the lag from tiny_i's end to post_i's start (the record node and an edge on its own
// branch) and from post_i's end to the next layer's start (the edge across to the main branch);
// --post 2 puts post_i on a third stream instead, forked off the record: the next layer then waits on the record
// node itself, as without --post, and post_i measures when a kernel on another branch sees the record;
// --marks 1 adds a kernel at the head of the graph that stamps when each replay starts, and the last kernel stamps when
// it ends: whether a replay starts before the previous one has ended (queued replays);
// --after legacy launches a one-thread kernel into the legacy stream after every graph launch (a graph launched
// into a blocking stream then has a legacy-stream operation waiting on it: the implicit synchronisation engaged);
// --blockers K creates K blocking streams (cudaStreamCreate, one kernel each) before the replays, that a launch into
// the legacy stream is documented to synchronise with.
// build: nvcc -O2 -arch=sm_90 -o repro repro.cu -lcublas
// reproduce (the gap before layer i grows with i):  ./repro --launch legacy --busy gemm --tail 1 --record shared
// controls (flat):  the same with --launch created (the default), or with --record none
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, cudaGetErrorString(e_)); \
  exit(2); } } while (0)

typedef unsigned long long u64;

__device__ __forceinline__ u64 gtime() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

// st/en: [replay][slot]; slot 2i = busy_i, 2i+1 = tiny_i.  Block starts -> atomicMin, block ends -> atomicMax.
__global__ void busy(u64* st, u64* en, const volatile unsigned* ctr, int slot, int slots, u64 work_ns) {
  __shared__ u64 t0;
  cudaGridDependencySynchronize();  // a no-op unless launched with PDL
  if (threadIdx.x == 0) { t0 = gtime(); atomicMin(&st[(u64)(*ctr) * slots + slot], t0); }
  __syncthreads();
  while (gtime() - t0 < work_ns) { }
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&en[(u64)(*ctr) * slots + slot], gtime());
}

__global__ void reduce(float* x, size_t n) {  // a split-K reduce stand-in: waits for its primary, then a short pass
  cudaGridDependencySynchronize();
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] += 1.0f;
}

__global__ void tiny(u64* st, u64* en, const volatile unsigned* ctr, int slot, int slots) {
  u64 t = gtime(), i = (u64)(*ctr) * slots + slot;
  st[i] = t;
  en[i] = gtime();
}

__global__ void copyk(u64* st, u64* en, const volatile unsigned* ctr, int slot, int slots, float4* dst,
                      const float4* src, size_t n) {
  if (threadIdx.x == 0) atomicMin(&st[(u64)(*ctr) * slots + slot], gtime());
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = src[i];
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&en[(u64)(*ctr) * slots + slot], gtime());
}

__global__ void tanhk(float* x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] = tanhf(x[i]);
}

__global__ void fill(float* x, size_t n, float scale, unsigned seed) {  // uniform(-scale, scale), hashed
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    x[i] = scale * ((h & 0xffffff) / 8388608.0f - 1.0f);
  }
}

__global__ void tick(volatile unsigned* ctr) { *ctr = *ctr + 1; }

__global__ void noop() {}

__global__ void head_mark(u64* heads, unsigned* nh) { heads[atomicAdd(nh, 1u)] = gtime(); }  // --marks 1

__global__ void tick_mark(volatile unsigned* ctr, u64* tails) { tails[*ctr] = gtime(); *ctr = *ctr + 1; }

struct Opt {
  int n = 160, replays = 20, upload = 0, priority = 0, grid = 0, queued = 0, quiet = 0, hidden = 2048, tail = 0,
      autofree = 0, pdl = 0, post = 0, blockers = 0, marks = 0;
  double work_us = 200;
  std::string record = "shared", where = "side", join = "edge", busy = "spin", raw, launch = "created", after = "none";
};

static void usage() {
  fprintf(stderr, "usage: repro [--n N] [--work-us US] [--replays R] [--record none|internal|shared|distinct|node]\n"
                  "  [--where side|main] [--join edge|extwait|none] [--upload 0|1] [--priority 0|1|2] [--grid BLOCKS]\n"
                  "  [--queued 0|1] [--busy spin|copy|gemm] [--hidden H] [--tail 0|1] [--autofree 0|1] [--pdl 0..3] [--raw FILE]\n"
                  "  [--launch created|legacy|per_thread|blocking] [--post 0|1|2] [--after none|legacy] [--blockers K] [--marks 0|1]\n"
                  "  [--quiet 1]\n");
  exit(64);
}

static Opt parse(int argc, char** argv) {
  Opt o;
  for (int i = 1; i < argc; i++) {
    std::string k = argv[i];
    if (i + 1 >= argc) usage();
    const char* v = argv[++i];
    if (k == "--n") o.n = atoi(v); else if (k == "--work-us") o.work_us = atof(v);
    else if (k == "--replays") o.replays = atoi(v); else if (k == "--record") o.record = v;
    else if (k == "--where") o.where = v; else if (k == "--join") o.join = v;
    else if (k == "--upload") o.upload = atoi(v); else if (k == "--priority") o.priority = atoi(v);
    else if (k == "--grid") o.grid = atoi(v); else if (k == "--queued") o.queued = atoi(v);
    else if (k == "--raw") o.raw = v; else if (k == "--quiet") o.quiet = atoi(v);
    else if (k == "--busy") o.busy = v; else if (k == "--hidden") o.hidden = atoi(v);
    else if (k == "--tail") o.tail = atoi(v); else if (k == "--autofree") o.autofree = atoi(v);
    else if (k == "--pdl") o.pdl = atoi(v);
    else if (k == "--post") o.post = atoi(v); else if (k == "--blockers") o.blockers = atoi(v);
    else if (k == "--marks") o.marks = atoi(v);
    else if (k == "--after") { o.after = v; if (o.after != "none" && o.after != "legacy") usage(); }
    else if (k == "--launch") { o.launch = v; if (o.launch != "legacy" && o.launch != "created" && o.launch != "per_thread" && o.launch != "blocking") usage(); }
    else usage();
  }
  const char* recs[] = {"none", "internal", "shared", "distinct", "node"};
  bool ok = o.n >= 1 && o.replays >= 1 && o.work_us >= 0 && (o.where == "side" || o.where == "main") &&
            (o.join == "edge" || o.join == "extwait" || o.join == "none") && o.hidden >= 16 &&
            (o.busy == "spin" || o.busy == "copy" || o.busy == "gemm") && o.blockers >= 0 &&
            (o.post == 0 || ((o.post == 1 || o.post == 2) && o.where == "side")) && (o.marks == 0 || o.marks == 1) &&
            std::find(std::begin(recs), std::end(recs), o.record) != std::end(recs);
  bool ext = o.record == "shared" || o.record == "distinct" || o.record == "node";
  if (!ok || (o.join == "extwait" && !ext)) usage();  // an external wait needs an external record to wait on
  return o;
}

int main(int argc, char** argv) {
  Opt o = parse(argc, argv);
  int dev = 0, drv = 0, rt = 0, sms = 0;
  cudaDeviceProp p;
  CK(cudaSetDevice(dev)); CK(cudaGetDeviceProperties(&p, dev));
  CK(cudaDriverGetVersion(&drv)); CK(cudaRuntimeGetVersion(&rt));
  sms = p.multiProcessorCount;
  int grid = o.grid > 0 ? o.grid : 2 * sms;
  const int slots = 2 * o.n;
  const size_t cells = (size_t)o.replays * slots + slots;  // + one spare replay's slots (never read)
  u64 *st, *en; unsigned* ctr;
  CK(cudaMalloc(&st, cells * sizeof(u64))); CK(cudaMalloc(&en, cells * sizeof(u64))); CK(cudaMalloc(&ctr, 4));
  CK(cudaMemset(st, 0xff, cells * sizeof(u64))); CK(cudaMemset(en, 0, cells * sizeof(u64))); CK(cudaMemset(ctr, 0, 4));
  const size_t pcells = (size_t)(o.replays + 1) * o.n;  // --post: post_i's stamps, [replay][layer]
  u64 *pst, *pen;
  CK(cudaMalloc(&pst, pcells * sizeof(u64))); CK(cudaMalloc(&pen, pcells * sizeof(u64)));
  CK(cudaMemset(pst, 0xff, pcells * sizeof(u64))); CK(cudaMemset(pen, 0, pcells * sizeof(u64)));
  u64 *heads, *tails; unsigned* nh;  // --marks: each replay's start and end, in launch order
  CK(cudaMalloc(&heads, (o.replays + 1) * sizeof(u64))); CK(cudaMalloc(&tails, (o.replays + 1) * sizeof(u64)));
  CK(cudaMalloc(&nh, 4)); CK(cudaMemset(nh, 0, 4));

  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));  // hi = the greatest priority (numerically lowest)
  cudaStream_t s0, s1, s2;
  CK(cudaStreamCreateWithPriority(&s0, cudaStreamNonBlocking, o.priority == 1 ? lo : 0));
  CK(cudaStreamCreateWithPriority(&s1, cudaStreamNonBlocking, o.priority == 1 ? hi : 0));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));  // --post 2: post_i's own branch
  cudaEvent_t shared_ev;
  CK(cudaEventCreateWithFlags(&shared_ev, cudaEventDisableTiming));
  std::vector<cudaEvent_t> ev(4 * o.n + 1);  // per layer: fork, join, the distinct / internal record event, --post 2's fork
  for (auto& e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const u64 work_ns = (u64)(o.work_us * 1000.0);
  const size_t ncopy = o.busy == "copy" ? (size_t)(o.work_us * 1.5e6 / 16) + 1 : 1, ntail = 1 << 21;
  const size_t nx = (size_t)1024 * o.hidden, nw = (size_t)o.hidden * o.hidden;
  float4 *csrc, *cdst; float *tailbuf, *xa, *xb, *w;
  CK(cudaMalloc(&csrc, ncopy * 16)); CK(cudaMalloc(&cdst, ncopy * 16)); CK(cudaMalloc(&tailbuf, ntail * 4));
  CK(cudaMalloc(&xa, (o.busy == "gemm" ? nx : 1) * 4)); CK(cudaMalloc(&xb, (o.busy == "gemm" ? nx : 1) * 4));
  CK(cudaMalloc(&w, (o.busy == "gemm" ? nw : 1) * 4));
  fill<<<1024, 256>>>((float*)csrc, ncopy * 4, 1.0f, 1); fill<<<1024, 256>>>(tailbuf, ntail, 1.0f, 2);
  if (o.busy == "gemm") { fill<<<1024, 256>>>(xa, nx, 1.0f, 3); fill<<<1024, 256>>>(w, nw, sqrtf(3.0f / o.hidden), 4); }
  CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
  cublasHandle_t blas = nullptr; void* ws = nullptr;
  if (o.busy == "gemm") {  // a fixed workspace: cuBLAS then allocates nothing during capture; default math (no TF32)
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); return 2; }
    CK(cudaMalloc(&ws, 32 << 20));
    if (cublasSetWorkspace(blas, ws, 32 << 20) || cublasSetStream(blas, s0)) { fprintf(stderr, "cuBLAS setup failed\n"); return 2; }
  }
  const float one = 1.0f, zero = 0.0f;

  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeThreadLocal));
  cudaStream_t side = o.where == "side" ? s1 : s0;
  if (o.marks) { head_mark<<<1, 1, 0, s0>>>(heads, nh); CK(cudaGetLastError()); }
  if (side != s0) { CK(cudaEventRecord(ev[0], s0)); CK(cudaStreamWaitEvent(s1, ev[0], 0)); }  // s1 joins capture
  for (int i = 0; i < o.n; i++) {
    cudaLaunchAttribute pa; pa.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pa.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lc = {}; lc.blockDim = dim3(128); lc.stream = s0; lc.attrs = &pa; lc.numAttrs = 1;
    if (o.busy == "spin" && (o.pdl & 1)) { lc.gridDim = dim3(grid); CK(cudaLaunchKernelEx(&lc, busy, st, en, (const volatile unsigned*)ctr, 2 * i, slots, work_ns)); }
    else if (o.busy == "spin") busy<<<grid, 128, 0, s0>>>(st, en, ctr, 2 * i, slots, work_ns);
    else if (o.busy == "copy") copyk<<<grid, 256, 0, s0>>>(st, en, ctr, 2 * i, slots, cdst, csrc, ncopy);
    else {
      tiny<<<1, 1, 0, s0>>>(st, en, ctr, 2 * i, slots);  // stamps when the layer's work may start
      float *in = i % 2 ? xb : xa, *out = i % 2 ? xa : xb;  // out(h x 1024) = w(h x h) in(h x 1024), column-major
      if (cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, o.hidden, 1024, o.hidden, &one, w, o.hidden, in, o.hidden, &zero,
                      out, o.hidden) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasSgemm failed\n"); return 2; }
    }
    CK(cudaGetLastError());
    if (o.pdl & 2) { lc.gridDim = dim3(sms); CK(cudaLaunchKernelEx(&lc, reduce, tailbuf, ntail)); }
    if (o.tail) { tanhk<<<2 * sms, 256, 0, s0>>>(o.busy == "gemm" ? (i % 2 ? xa : xb) : tailbuf, o.busy == "gemm" ? nx : ntail); CK(cudaGetLastError()); }
    if (side != s0) { CK(cudaEventRecord(ev[3 * i], s0)); CK(cudaStreamWaitEvent(s1, ev[3 * i], 0)); }
    tiny<<<1, 1, 0, side>>>(st, en, ctr, 2 * i + 1, slots);
    CK(cudaGetLastError());
    cudaEvent_t rec = o.record == "distinct" ? ev[3 * i + 2] : shared_ev;
    if (o.record == "internal") CK(cudaEventRecord(ev[3 * i + 2], side));
    else if (o.record == "shared" || o.record == "distinct")
      CK(cudaEventRecordWithFlags(rec, side, cudaEventRecordExternal));
    else if (o.record == "node") {  // NCCL's way: add the node to the capture graph by hand, then depend on it
      cudaStreamCaptureStatus cs; cudaGraph_t g; const cudaGraphNode_t* deps; size_t nd; cudaGraphNode_t node;
      CK(cudaStreamGetCaptureInfo(side, &cs, nullptr, &g, &deps, nullptr, &nd));
      CK(cudaGraphAddEventRecordNode(&node, g, deps, nd, shared_ev));
      CK(cudaStreamUpdateCaptureDependencies(side, &node, nullptr, 1, cudaStreamSetCaptureDependencies));
    }
    if (o.post == 1) { tiny<<<1, 1, 0, side>>>(pst, pen, ctr, i, o.n); CK(cudaGetLastError()); }
    if (o.post == 2) {  // fork s2 off the record (an internal record: an edge, no node); s1 still ends at the record
      CK(cudaEventRecord(ev[3 * o.n + i], side)); CK(cudaStreamWaitEvent(s2, ev[3 * o.n + i], 0));
      tiny<<<1, 1, 0, s2>>>(pst, pen, ctr, i, o.n); CK(cudaGetLastError());
    }
    if (side != s0 && o.join == "edge") { CK(cudaEventRecord(ev[3 * i + 1], s1)); CK(cudaStreamWaitEvent(s0, ev[3 * i + 1], 0)); }
    if (o.join == "extwait") CK(cudaStreamWaitEvent(s0, rec, cudaEventWaitExternal));
  }
  if (side != s0) { CK(cudaEventRecord(ev[1], s1)); CK(cudaStreamWaitEvent(s0, ev[1], 0)); }  // final join
  if (o.post == 2) { CK(cudaEventRecord(ev[4 * o.n], s2)); CK(cudaStreamWaitEvent(s0, ev[4 * o.n], 0)); }
  if (o.marks) tick_mark<<<1, 1, 0, s0>>>(ctr, tails);
  else tick<<<1, 1, 0, s0>>>(ctr);
  CK(cudaGetLastError());
  CK(cudaStreamEndCapture(s0, &graph));
  size_t nodes = 0;
  CK(cudaGraphGetNodes(graph, nullptr, &nodes));
  std::vector<cudaGraphNode_t> all(nodes);
  CK(cudaGraphGetNodes(graph, all.data(), &nodes));
  int types[32] = {0};  // node census by cudaGraphNodeType
  for (auto nd : all) { cudaGraphNodeType t; CK(cudaGraphNodeGetType(nd, &t)); types[(int)t & 31]++; }
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiateWithFlags(&exec, graph, (o.priority ? cudaGraphInstantiateFlagUseNodePriority : 0) |
                                                 (o.autofree ? cudaGraphInstantiateFlagAutoFreeOnLaunch : 0)));
  if (o.upload) { CK(cudaGraphUpload(exec, s0)); CK(cudaStreamSynchronize(s0)); }
  // the launch stream: s0 (created, non-blocking), the legacy default stream, the per-thread default stream, or a
  // created blocking stream (cudaStreamCreate: synchronises with the legacy stream, as the per-thread one does)
  cudaStream_t ls = s0;
  if (o.launch == "legacy") ls = cudaStreamLegacy;
  else if (o.launch == "per_thread") ls = cudaStreamPerThread;
  else if (o.launch == "blocking") CK(cudaStreamCreate(&ls));
  std::vector<cudaStream_t> blockers(o.blockers);
  for (auto& b : blockers) { CK(cudaStreamCreate(&b)); noop<<<1, 1, 0, b>>>(); CK(cudaGetLastError()); }
  CK(cudaDeviceSynchronize());
  for (int r = 0; r < o.replays; r++) {
    CK(cudaGraphLaunch(exec, ls));
    if (o.after == "legacy") { noop<<<1, 1, 0, cudaStreamLegacy>>>(); CK(cudaGetLastError()); }
    if (!o.queued) CK(o.after == "legacy" ? cudaDeviceSynchronize() : cudaStreamSynchronize(ls));
  }
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  std::vector<u64> hs(cells), he(cells);
  CK(cudaMemcpy(hs.data(), st, cells * sizeof(u64), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(he.data(), en, cells * sizeof(u64), cudaMemcpyDeviceToHost));

  // gap of each kernel of each replay (all streams), then per position the median over replays
  std::vector<std::vector<double>> gb(o.n), gt(o.n);  // gap before busy_i / tiny_i, one value per replay
  std::vector<double> span(o.replays), busy_us, layer_us;  // layer: start of slot 2i to start of tiny_i
  for (int r = 0; r < o.replays; r++) {
    const u64* s = &hs[(size_t)r * slots]; const u64* e = &he[(size_t)r * slots];
    std::vector<int> idx(slots);
    for (int k = 0; k < slots; k++) {
      idx[k] = k;
      if (s[k] == ~0ULL || e[k] == 0) { fprintf(stderr, "replay %d slot %d never stamped\n", r, k); return 3; }
    }
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return s[a] < s[b]; });
    u64 last = 0, first = s[idx[0]];
    for (int j = 0; j < slots; j++) {
      int k = idx[j];
      if (j > 0) (k % 2 ? gt : gb)[k / 2].push_back(s[k] > last ? (s[k] - last) / 1e3 : 0.0);
      last = std::max(last, e[k]);
      if (k % 2 == 0) { busy_us.push_back((e[k] - s[k]) / 1e3); layer_us.push_back(((double)s[k + 1] - s[k]) / 1e3); }
    }
    span[r] = (last - first) / 1e3;
  }
  auto median = [](std::vector<double> v) { if (v.empty()) return 0.0; std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  std::vector<double> mb(o.n);
  for (int i = 0; i < o.n; i++) mb[i] = median(gb[i]);
  // least-squares slope of the median gap before busy_i against i, i >= 1
  double sx = 0, sy = 0, sxx = 0, sxy = 0; int m = 0;
  for (int i = 1; i < o.n; i++) { sx += i; sy += mb[i]; sxx += (double)i * i; sxy += i * mb[i]; m++; }
  double slope = m > 1 ? (m * sxy - sx * sy) / (m * sxx - sx * sx) : 0.0;
  double q[4] = {0, 0, 0, 0}; int qn[4] = {0, 0, 0, 0};
  for (int i = 1; i < o.n; i++) { int b = std::min(3, i * 4 / o.n); q[b] += mb[i]; qn[b]++; }
  printf("# device %s  sm_%d%d  SMs %d  driver %d.%d  runtime %d.%d\n", p.name, p.major, p.minor, sms,
         drv / 1000, (drv % 1000) / 10, rt / 1000, (rt % 1000) / 10);
  printf("# n %d busy %s work_us %g hidden %d tail %d record %s where %s join %s upload %d priority %d autofree %d "
         "grid %d queued %d replays %d nodes %zu\n", o.n, o.busy.c_str(), o.work_us, o.hidden, o.tail, o.record.c_str(),
         o.where.c_str(), o.join.c_str(), o.upload, o.priority, o.autofree, grid, o.queued, o.replays, nodes);
  printf("# pdl %d launch %s post %d after %s blockers %d marks %d; nodes: kernel %d memcpy %d memset %d event_record %d wait_event %d other %d\n", o.pdl,
         o.launch.c_str(), o.post, o.after.c_str(), o.blockers, o.marks, types[cudaGraphNodeTypeKernel], types[cudaGraphNodeTypeMemcpy],
         types[cudaGraphNodeTypeMemset], types[cudaGraphNodeTypeEventRecord], types[cudaGraphNodeTypeWaitEvent],
         (int)nodes - types[cudaGraphNodeTypeKernel] - types[cudaGraphNodeTypeMemcpy] - types[cudaGraphNodeTypeMemset] -
             types[cudaGraphNodeTypeEventRecord] - types[cudaGraphNodeTypeWaitEvent]);
  printf("# busy-slot kernel median %.1f us; busy-slot start to tiny start %.1f us; replay span median %.1f us "
         "(%.1f us per layer)\n", median(busy_us), median(layer_us), median(span), median(span) / o.n);
  printf("# median gap before busy_i by quarter (i>=1): %.2f %.2f %.2f %.2f us; slope %.4f us per layer\n",
         qn[0] ? q[0] / qn[0] : 0, qn[1] ? q[1] / qn[1] : 0, qn[2] ? q[2] / qn[2] : 0, qn[3] ? q[3] / qn[3] : 0, slope);
  std::vector<double> lrec(o.n), ljoin(o.n);  // --post: median over replays of each lag, per layer
  if (o.post) {
    std::vector<u64> ps(pcells), pe(pcells);
    CK(cudaMemcpy(ps.data(), pst, pcells * sizeof(u64), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(pe.data(), pen, pcells * sizeof(u64), cudaMemcpyDeviceToHost));
    for (int i = 0; i < o.n; i++) {
      std::vector<double> a, b;
      for (int r = 0; r < o.replays; r++) {
        size_t c = (size_t)r * o.n + i, t = (size_t)r * slots + 2 * i + 1;
        if (ps[c] == ~0ULL || pe[c] == 0) { fprintf(stderr, "replay %d post %d never stamped\n", r, i); return 3; }
        a.push_back(((double)ps[c] - (double)he[t]) / 1e3);
        if (i + 1 < o.n) b.push_back(((double)hs[t + 1] - (double)pe[c]) / 1e3);
      }
      lrec[i] = median(a); ljoin[i] = median(b);
    }
    auto quarters = [&](const std::vector<double>& v, int upto, double* out) {
      double s4[4] = {0, 0, 0, 0}; int c4[4] = {0, 0, 0, 0};
      for (int i = 1; i < upto; i++) { int b = std::min(3, i * 4 / o.n); s4[b] += v[i]; c4[b]++; }
      for (int b = 0; b < 4; b++) out[b] = c4[b] ? s4[b] / c4[b] : 0;
    };
    double qa[4], qb[4];
    quarters(lrec, o.n, qa); quarters(ljoin, o.n - 1, qb);
    printf("# post: tiny_i end -> post_i start (the record, same branch) by quarter: %.2f %.2f %.2f %.2f us; "
           "post_i end -> next layer start (the edge across) by quarter: %.2f %.2f %.2f %.2f us\n",
           qa[0], qa[1], qa[2], qa[3], qb[0], qb[1], qb[2], qb[3]);
  }
  if (o.marks) {  // replay r+1's head against replay r's last kernel
    std::vector<u64> hh(o.replays), tt(o.replays);
    CK(cudaMemcpy(hh.data(), heads, o.replays * sizeof(u64), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(tt.data(), tails, o.replays * sizeof(u64), cudaMemcpyDeviceToHost));
    std::vector<double> d, dur;
    int early = 0;
    for (int r = 0; r + 1 < o.replays; r++) {
      d.push_back(((double)hh[r + 1] - (double)tt[r]) / 1e3);
      if (hh[r + 1] < tt[r]) early++;
    }
    for (int r = 0; r < o.replays; r++) dur.push_back(((double)tt[r] - (double)hh[r]) / 1e3);
    printf("# marks: replay r+1 started before replay r ended in %d of %d pairs; start(r+1) - end(r) median %.1f us, "
           "min %.1f us; head to end of a replay median %.1f us\n", early, o.replays - 1, median(d),
           d.empty() ? 0.0 : *std::min_element(d.begin(), d.end()), median(dur));
  }
  if (!o.quiet) {
    printf("position,gap_before_busy_us,gap_before_tiny_us%s\n", o.post ? ",record_lag_us,join_lag_us" : "");
    for (int i = 0; i < o.n; i++) {
      printf("%d,%.3f,%.3f", i, mb[i], median(gt[i]));
      if (o.post) printf(",%.3f,%.3f", lrec[i], ljoin[i]);
      printf("\n");
    }
  }
  if (!o.raw.empty()) {  // raw stamps: one header line, then int64 start,end per [replay][slot]
    FILE* f = fopen(o.raw.c_str(), "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", o.raw.c_str()); return 4; }
    fprintf(f, "{\"n\": %d, \"work_us\": %g, \"record\": \"%s\", \"where\": \"%s\", \"join\": \"%s\", \"upload\": %d, "
               "\"priority\": %d, \"grid\": %d, \"queued\": %d, \"replays\": %d, \"nodes\": %zu, \"device\": \"%s\", "
               "\"driver\": %d, \"runtime\": %d, \"busy\": \"%s\", \"hidden\": %d, \"tail\": %d, \"autofree\": %d, \"pdl\": %d, \"launch\": \"%s\"}\n",
            o.n, o.work_us, o.record.c_str(), o.where.c_str(), o.join.c_str(), o.upload, o.priority, grid, o.queued,
            o.replays, nodes, p.name, drv, rt, o.busy.c_str(), o.hidden, o.tail, o.autofree, o.pdl,
            o.launch.c_str());
    for (size_t c = 0; c < (size_t)o.replays * slots; c++) { fwrite(&hs[c], 8, 1, f); fwrite(&he[c], 8, 1, f); }
    fclose(f);
  }
  CK(cudaGraphExecDestroy(exec)); CK(cudaGraphDestroy(graph));
  return 0;
}
