// proto/device.hpp, the device seam: device names, what this process can reach, the CPU no-ops,
// out-of-memory messages, and DataProto::to across the worker boundary. Device-parametrised: the
// cuda half runs where a GPU is and skips elsewhere.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include <torch/torch.h>

#include "proto/data_proto.hpp"
#include "proto/device.hpp"

namespace tessera::proto {
namespace {

TEST(Device, NamesParseAsWorkersSpellThem) {
  EXPECT_EQ(*parse_device("cpu"), c10::Device(c10::DeviceType::CPU));
  EXPECT_EQ(*parse_device("cpu:3"), c10::Device(c10::DeviceType::CPU));  // every cpu:N is the host
  EXPECT_EQ(*parse_device("cuda"), c10::Device(c10::DeviceType::CUDA, 0));
  EXPECT_EQ(*parse_device("cuda:7"), c10::Device(c10::DeviceType::CUDA, 7));
  for (const char* bad : {"", "gpu:0", "cuda:", "cuda:x", "cuda:-1", "cpu:1:2", "cuda:1234"}) {
    auto d = parse_device(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), ErrorCode::invalid_argument);
    EXPECT_NE(d.status().message().find(std::string("'") + bad + "'"), std::string::npos) << d.status().to_string();
  }
}

TEST(Device, ACudaDeviceThisProcessCannotReachIsRefusedInOneLine) {
  EXPECT_TRUE(require_device(c10::Device(c10::DeviceType::CPU)).ok());
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  if (n > 0) EXPECT_TRUE(require_device(c10::Device(c10::DeviceType::CUDA, 0)).ok());
  Status st = require_device(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(n)));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::unavailable);
  EXPECT_NE(st.message().find("cuda:" + std::to_string(n)), std::string::npos) << st.to_string();
  EXPECT_EQ(st.message().find('\n'), std::string::npos);
}

TEST(Device, CpuCallsAreNoOps) {
  const c10::Device cpu(c10::DeviceType::CPU);
  { DeviceScope scope(cpu); }
  synchronize(cpu);
  DeviceMemory m = memory_stats(cpu);
  EXPECT_EQ(m.allocated + m.reserved + m.max_allocated + m.max_reserved, 0);
  reset_peak_memory(cpu);
  EXPECT_EQ(device_peak_flops(cpu), 0.0);
}

TEST(Device, OutOfMemoryKeepsTheSizesAndDropsTheAdvice) {
  c10::OutOfMemoryError oom(
      {"f", "file.cpp", 1},
      "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
      "1.25 GiB is free. Of the allocated memory 75.1 GiB is allocated by PyTorch. If reserved but "
      "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
  EXPECT_TRUE(is_out_of_memory(oom));
  EXPECT_FALSE(is_out_of_memory(std::runtime_error("x")));
  const std::string s = out_of_memory_summary(oom);
  EXPECT_NE(s.find("Tried to allocate 2.00 GiB"), std::string::npos) << s;
  EXPECT_NE(s.find("1.25 GiB is free"), std::string::npos) << s;
  EXPECT_EQ(s.find("PYTORCH_CUDA_ALLOC_CONF"), std::string::npos) << s;
  EXPECT_EQ(s.find('\n'), std::string::npos) << s;
}

DataProto sample() {
  TensorDict t;
  t.insert_or_assign("ids", at::arange(12, at::kLong).view({3, 4}));
  t.insert_or_assign("x", at::randn({3, 2}).t().contiguous().t());  // a non-contiguous column pair
  auto d = DataProto::from_dict(std::move(t));
  EXPECT_TRUE(d.ok());
  return *d;
}

TEST(Device, ToTheDeviceTheTensorsAreOnCopiesNothing) {
  DataProto d = sample();
  const void* ids = d.tensor("ids")->data_ptr();
  ASSERT_TRUE(d.to(c10::Device(c10::DeviceType::CPU), /*non_blocking=*/true).ok());
  EXPECT_EQ(d.tensor("ids")->data_ptr(), ids);
}

TEST(Device, AGpuRoundTripIsBitwiseAndLandsOnTheHost) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  DataProto d = sample();
  std::map<std::string, at::Tensor> original;
  for (const auto& [key, t] : d.batch()) original[key] = t.clone();
  const c10::Device gpu(c10::DeviceType::CUDA, 0);
  ASSERT_TRUE(d.to(gpu, /*non_blocking=*/true).ok());
  for (const auto& [key, t] : d.batch()) EXPECT_EQ(t.device(), gpu) << key;
  ASSERT_TRUE(d.to(c10::Device(c10::DeviceType::CPU), /*non_blocking=*/true).ok());
  for (const auto& [key, t] : d.batch()) {
    EXPECT_TRUE(t.is_cpu()) << key;
    EXPECT_TRUE(t.is_pinned()) << key;  // pinned, so the copy from the GPU could be asynchronous
    EXPECT_TRUE(at::equal(t, original.at(key))) << key;
  }
}

}  // namespace
}  // namespace tessera::proto
