// tests/cuda/cuda_sleep_test.cu — sleep and wake (docs/sleep.md) under a CUDA graph on a real GPU:
// tensors (device buffers) allocated through stitch::Allocator on backend:cuda under a Region, a
// CUDA graph captured (stream capture) over them — a kernel that computes two outputs from two
// inputs, every buffer allocated before the capture so that the graph reads and writes tagged
// memory only — replayed and its results copied to the host. Then the allocator sleeps: the
// reserved bytes fall to nothing and the device's free memory rises by what was reserved; it
// wakes, the graph is replayed at the same addresses and its results must be byte-equal to the
// first ones. Two cases: everything backed up (the outputs read back right after the wake, before
// the replay), and the outputs in a region without backup (their contents are lost: overwritten
// after the wake, then recomputed by the replay from the backed-up inputs). Skips without a
// device or without virtual memory management. tests/sleep_test.cpp runs sleep and wake on the
// simulated device on every test run. Helpers: cuda_test_util.cuh.
#include <cstring>
#include <string>
#include <vector>

#include "cuda_test_util.cuh"

// The kernels in a named namespace, static: a kernel in this file's anonymous namespace next to
// `using namespace stitch_cuda_test` (which has one of its own) makes nvcc's stub ambiguous.
namespace cuda_sleep_kernels {

static __global__ void init_inputs(float* a, float* b, std::uint64_t n) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    a[i] = static_cast<float>(i % 1000) * 0.001f + 0.25f;
    b[i] = static_cast<float>((i * 7) % 997) * 0.5f - 100.0f;
  }
}

static __global__ void compute(const float* a, const float* b, float* sum_of_products, float* mixed,
                               std::uint64_t n) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    sum_of_products[i] = a[i] * b[i] + 1.0f;
    mixed[i] = a[i] - 0.5f * b[i] + static_cast<float>(i & 0xff);
  }
}

}  // namespace cuda_sleep_kernels

namespace {

using namespace stitch_cuda_test;
using cuda_sleep_kernels::compute;
using cuda_sleep_kernels::init_inputs;

constexpr std::size_t kElems = std::size_t{16} << 20;  // 64 MiB of floats per tensor
constexpr std::size_t kBytes = kElems * sizeof(float);

std::vector<unsigned char> to_host(const void* p, std::size_t n) {
  std::vector<unsigned char> h(n);
  cuda_check(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return h;
}

bool same(const std::vector<unsigned char>& x, const std::vector<unsigned char>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size()) == 0;
}

std::size_t device_free() {
  std::size_t free = 0, total = 0;
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cuda_check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Graph() = default;
  ~Graph() {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
};

void graph_over_tagged_tensors(bool outputs_backed_up) {
  CUDA_OK(cudaSetDevice(0));
  Streams st(1);  // declared first: the stream outlives the allocator
  cudaStream_t s = st.s[0];
  MismatchCounter counter;
  const std::size_t free_at_start = settled_free_memory(s, counter);
  std::size_t granule = 0;
  {
    stitch::Allocator alloc(stitch::Config::parse("backend:cuda"));
    if (const std::string why = vmm_missing(alloc); !why.empty()) GTEST_SKIP() << why;
    granule = alloc.backend().granularity(0);
    float* a = nullptr;
    float* b = nullptr;
    float* out1 = nullptr;
    float* out2 = nullptr;
    {
      stitch::Allocator::Region weights(alloc, "weights", /*backup=*/true);
      a = static_cast<float*>(alloc.allocate(kBytes, s, 0));
      b = static_cast<float*>(alloc.allocate(kBytes, s, 0));
      if (outputs_backed_up) {
        out1 = static_cast<float*>(alloc.allocate(kBytes, s, 0));
        out2 = static_cast<float*>(alloc.allocate(kBytes, s, 0));
      }
    }
    if (!outputs_backed_up) {
      stitch::Allocator::Region scratch(alloc, "activations", /*backup=*/false);
      out1 = static_cast<float*>(alloc.allocate(kBytes, s, 0));
      out2 = static_cast<float*>(alloc.allocate(kBytes, s, 0));
    }
    init_inputs<<<1024, 256, 0, s>>>(a, b, kElems);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaStreamSynchronize(s));

    // The graph: one kernel over the tagged tensors, captured on s (no allocation inside).
    Graph g;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    compute<<<1024, 256, 0, s>>>(a, b, out1, out2, kElems);
    CUDA_OK(cudaStreamEndCapture(s, &g.graph));
    CUDA_OK(cudaGraphInstantiate(&g.exec, g.graph, 0));
    CUDA_OK(cudaGraphLaunch(g.exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    const std::vector<unsigned char> before1 = to_host(out1, kBytes);
    const std::vector<unsigned char> before2 = to_host(out2, kBytes);
    const std::vector<unsigned char> inputs_a = to_host(a, kBytes);

    // Sleep: every tag. The tagged memory is all there is, so nothing stays reserved.
    const std::int64_t reserved = stat(alloc, "reserved_bytes.all.current");
    ASSERT_GE(reserved, static_cast<std::int64_t>(4 * kBytes));
    const std::size_t free_awake = device_free();
    alloc.sleep(0);
    const std::size_t free_asleep = device_free();
    EXPECT_EQ(stat(alloc, "reserved_bytes.all.current"), 0) << "reserved bytes did not fall";
    EXPECT_EQ(stat(alloc, "sleeping_bytes.current"), static_cast<std::int64_t>(4 * kBytes));
    EXPECT_EQ(stat(alloc, "num_sleeps"), 1);
    EXPECT_GE(free_asleep + 2 * granule, free_awake + static_cast<std::size_t>(reserved))
        << "device free memory " << free_asleep << " asleep, " << free_awake << " awake, "
        << reserved << " bytes were reserved";
    EXPECT_NO_THROW(alloc.validate());

    // Wake: the same addresses, fresh pages, the backups back.
    alloc.wake(0);
    EXPECT_EQ(stat(alloc, "reserved_bytes.all.current"), reserved);
    EXPECT_EQ(stat(alloc, "sleeping_bytes.current"), 0);
    EXPECT_EQ(stat(alloc, "num_wakes"), 1);
    EXPECT_NO_THROW(alloc.validate());
    EXPECT_TRUE(same(to_host(a, kBytes), inputs_a)) << "a backed-up input changed over the sleep";
    if (outputs_backed_up) {
      EXPECT_TRUE(same(to_host(out1, kBytes), before1)) << "a backed-up output changed over the sleep";
      EXPECT_TRUE(same(to_host(out2, kBytes), before2)) << "a backed-up output changed over the sleep";
    }
    // Whatever the outputs hold now, the replay must write them again.
    CUDA_OK(cudaMemsetAsync(out1, 0xff, kBytes, s));
    CUDA_OK(cudaMemsetAsync(out2, 0xff, kBytes, s));
    CUDA_OK(cudaGraphLaunch(g.exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaGetLastError());
    EXPECT_TRUE(same(to_host(out1, kBytes), before1)) << "the graph's first output differs after the wake";
    EXPECT_TRUE(same(to_host(out2, kBytes), before2)) << "the graph's second output differs after the wake";
    std::printf("graph over %zu MiB of tagged tensors (outputs %s): reserved %lld bytes, device free "
                "%zu awake, %zu asleep; results equal after the wake\n",
                4 * kBytes / kMiB, outputs_backed_up ? "backed up" : "not backed up",
                static_cast<long long>(reserved), free_awake, free_asleep);

    for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(out1),
                    static_cast<void*>(out2)})
      alloc.deallocate(p);
    EXPECT_EQ(stat(alloc, "allocated_bytes.all.current"), 0);
    alloc.empty_cache();
    EXPECT_EQ(stat(alloc, "reserved_bytes.all.current"), 0);
  }
  expect_memory_back(free_at_start, granule);
}

TEST(CudaSleep, AGraphOverBackedUpTensorsGivesTheSameResultsAfterTheWake) {
  REQUIRE_CUDA_DEVICE();
  graph_over_tagged_tensors(/*outputs_backed_up=*/true);
}

TEST(CudaSleep, AGraphRecomputesOutputsThatWereNotBackedUp) {
  REQUIRE_CUDA_DEVICE();
  graph_over_tagged_tensors(/*outputs_backed_up=*/false);
}

}  // namespace
