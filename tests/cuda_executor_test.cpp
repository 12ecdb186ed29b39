// The CUDA executor: without a GPU it says why and the GPU tests skip;
// with one, its kernel bodies compute the emulated executor's bits.  That
// both executors compile the same kernel source is checked everywhere.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/device_math.hpp"
#include "gpu/emulated.hpp"
#include "gpu/kernels.hpp"
#include "tests/source_dir.hpp"

#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
#include "gpu/cuda/cuda_executor.hpp"
#endif

namespace accumcheck {
namespace {

std::string read_source(const std::string& rel) {
  std::ifstream in(::accumcheck::testing_util::source_dir() + "/" + rel);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Both executors' translation units take their kernel bodies from
// gpu/kernels.hpp through gpu/device_impl.hpp, and nothing else defines
// a kernel body.
TEST(KernelSource, BothExecutorsIncludeTheSameKernelHeader) {
  const std::string impl = read_source("gpu/device_impl.hpp");
  const std::string emulated = read_source("gpu/emulated.cpp");
  const std::string cuda = read_source("gpu/cuda/cuda.cu");
  ASSERT_FALSE(impl.empty());
  ASSERT_FALSE(emulated.empty());
  ASSERT_FALSE(cuda.empty());
  EXPECT_NE(impl.find("#include \"gpu/kernels.hpp\""), std::string::npos);
  EXPECT_NE(emulated.find("#include \"gpu/device_impl.hpp\""),
            std::string::npos);
  EXPECT_NE(cuda.find("#include \"gpu/device_impl.hpp\""), std::string::npos);
  EXPECT_NE(cuda.find("#include \"gpu/kernels.hpp\""), std::string::npos);
  EXPECT_NE(std::string(emulated_kernel_source_digest()), "unknown");
#ifdef ACCUMCHECK_HAVE_CUDA_TARGET
  EXPECT_STREQ(emulated_kernel_source_digest(), cuda_kernel_source_digest());
#endif
}

#ifdef ACCUMCHECK_HAVE_CUDA_TARGET

TEST(CudaExecutor, ReportsMissingGpuClearly) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(why.rfind("no CUDA device: ", 0), 0u) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
  try {
    CudaExecutor ex;
    FAIL() << "CudaExecutor constructed without a GPU";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), why);
  }
  ModelSpec m{{2, 1}, Activation::identity, LossKind::mse};
  Dataset d;
  d.n = 1;
  d.d_in = 2;
  d.d_out = 1;
  d.x = {1, 2};
  d.y = {3};
  EXPECT_THROW(CudaDevice(m, d, std::vector<float>(3)), std::runtime_error);
  const std::string header = cuda_trace_header();
  EXPECT_NE(header.find("CUDA toolkit"), std::string::npos) << header;
  EXPECT_NE(header.find("no CUDA device"), std::string::npos) << header;
  EXPECT_NE(header.find(", compiled for sm "), std::string::npos) << header;
}

class CudaGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_available(&why)) GTEST_SKIP() << why;
  }
};

TEST_F(CudaGpu, TraceHeaderNamesTheDevice) {
  const std::string h = cuda_trace_header();
  EXPECT_NE(h.find("SMs"), std::string::npos) << h;
  std::printf("[ cuda ] %s\n", h.c_str());
}

// Device math and activations on the GPU: the CPU's bits exactly.
TEST_F(CudaGpu, MathBitsEqualTheEmulatedExecutor) {
  std::vector<float> xs;
  for (uint32_t b = 0; b < 0x7f800000u; b += 4099) {
    xs.push_back(std::bit_cast<float>(b));
    xs.push_back(-std::bit_cast<float>(b));
  }
  for (int which = 0; which < 12; ++which) {
    const std::vector<float> gpu = cuda_eval_math(which, xs);
    int64_t diff = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const float x = xs[i];
      float cpu;
      if (which == 0)
        cpu = dm::ac_expf(x);
      else if (which == 1)
        cpu = dm::ac_logf(x);
      else if (which == 2)
        cpu = dm::ac_tanhf(x);
      else if (which == 3)
        cpu = dm::ac_erff(x);
      else if (which < 8)
        cpu = kern::activation(kern::Act(which - 4), x);
      else {
        const kern::Act a = kern::Act(which - 8);
        cpu = kern::activation_derivative(a, x, kern::activation(a, x));
      }
      if (std::bit_cast<uint32_t>(cpu) != std::bit_cast<uint32_t>(gpu[i]))
        ++diff;
    }
    EXPECT_EQ(diff, 0) << "function " << which;
  }
}

// Every step, the matrix products included, is a kernel body with its
// order written down (gpu/kernels.hpp), so the whole engine is the
// emulated executor's bits: the loss, every gradient, parameter and
// optimizer state element, on data that makes every product exact and on
// data that rounds, over several optimizer steps.
TEST_F(CudaGpu, EngineMatchesEmulated) {
  for (bool dyadic : {true, false}) {
    ModelSpec m{{4, 8, 4},
                dyadic ? Activation::relu : Activation::gelu,
                dyadic ? LossKind::mse : LossKind::cross_entropy};
    Dataset d;
    d.n = 16;
    d.d_in = 4;
    d.d_out = 4;
    d.loss = m.loss;
    uint32_t s = 7;
    auto next = [&] {
      s = s * 1103515245u + 12345u;
      return int((s >> 16) % 9) - 4;
    };
    const float scale = dyadic ? 0.125f : 0.1f;  // 0.1: products round
    for (int i = 0; i < 64; ++i) d.x.push_back(float(next()) * scale);
    if (dyadic)
      for (int i = 0; i < 64; ++i) d.y.push_back(float(next()) * scale);
    else
      for (int i = 0; i < 16; ++i) d.label.push_back((next() + 4) % 4);
    std::vector<float> p(size_t(layout_of(m).total));
    for (float& v : p) v = float(next()) * scale;
    EmulatedDevice cpu(m, d, p);
    CudaDevice gpu(m, d, p);
    OptimizerSpec opt;
    opt.kind = OptimizerKind::adam;
    auto bits = [](const std::vector<float>& v) {
      std::vector<uint32_t> b;
      for (float x : v) b.push_back(std::bit_cast<uint32_t>(x));
      return b;
    };
    for (int step = 0; step < 3; ++step) {
      const std::vector<int64_t> ids = {2 * step,     2 * step + 1,
                                        2 * step + 5, 2 * step + 6,
                                        2 * step + 7, 15 - step};
      const float lc = cpu.forward_backward(ids, 6);
      const float lg = gpu.forward_backward(ids, 6);
      EXPECT_EQ(std::bit_cast<uint32_t>(lc), std::bit_cast<uint32_t>(lg))
          << "step " << step;
      EXPECT_EQ(std::bit_cast<uint32_t>(cpu.grad_norm()),
                std::bit_cast<uint32_t>(gpu.grad_norm()));
      cpu.optimizer_step(opt, 1e-2);
      gpu.optimizer_step(opt, 1e-2);
      const auto sc = cpu.state(), sg = gpu.state();
      EXPECT_EQ(bits(sc.grads), bits(sg.grads)) << "step " << step;
      EXPECT_EQ(bits(sc.params), bits(sg.params)) << "step " << step;
      EXPECT_EQ(bits(sc.exp_avg), bits(sg.exp_avg)) << "step " << step;
      EXPECT_EQ(bits(sc.exp_avg_sq), bits(sg.exp_avg_sq)) << "step " << step;
      cpu.zero_grad();
      gpu.zero_grad();
    }
  }
}

// A fresh buffer's zero fill is ordered before the first kernel on the
// executor's stream (a fill on the legacy default stream raced the kernels
// of the executor's non-blocking stream: on an H100 shared by 16 processes,
// 8 CUDA tests read gradients back as zeros).
TEST_F(CudaGpu, FreshBufferFillIsOrderedBeforeTheFirstKernel) {
  EXPECT_EQ(cuda_fresh_buffer_misses(int64_t(1) << 20, 50), 0);
}

#endif  // ACCUMCHECK_HAVE_CUDA_TARGET

}  // namespace
}  // namespace accumcheck
