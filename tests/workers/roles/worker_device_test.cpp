// The worker roles on their device, checked against the CPU. Each test runs once per device this
// process has: "cpu:0" always (CI), "cuda:0" where a GPU is (the cuda instances skip without one).
// On a GPU the comparisons are the acceptance checks: init_model leaves nothing on the
// host, greedy rollout equals the CPU token for token and sampling from one seed draws the same
// tokens, an FSDP FULL_SHARD AdamW step on 2 ranks matches the CPU, offload round trips are
// bitwise, and methods hand DataProtos back on the host (Note [Crossing the worker boundary]).
#include <ATen/core/CachingHostAllocator.h>
#include <gtest/gtest.h>

#include "proto/device.hpp"
#include "proto/host_transfer.hpp"
#include "tests/workers/roles/worker_test_util.hpp"
#include "workers/roles/actor_rollout_ref_worker.hpp"
#include "workers/roles/worker_support.hpp"

namespace tessera::workers {
namespace {

using namespace testing;  // NOLINT

const c10::Device kCpu(c10::DeviceType::CPU);

class OnDevice : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    device_ = *proto::parse_device(GetParam());
    if (!proto::require_device(device_).ok()) GTEST_SKIP() << GetParam() << " is not available here";
    at::globalContext().setAllowTF32CuBLAS(false);  // fp32 comparisons at fp32 precision
    scope_.emplace(device_);
  }
  runtime::WorkerContext ctx(int rank, int world, uint16_t port) const {
    runtime::WorkerContext c = context(rank, world, port);
    if (device_.is_cuda()) c.device = GetParam();  // ranks of one test share the one GPU
    return c;
  }
  // Calls a DP_COMPUTE_PROTO method through the worker's method table, as the runtime does.
  static proto::DataProto call(ActorRolloutRefWorker& w, const std::string& method, const proto::DataProto& in) {
    auto out = w.methods().invoke(method, {dispatch::Value(in)});
    EXPECT_TRUE(out.ok()) << method << ": " << out.status().to_string();
    if (!out.ok()) return proto::DataProto();
    return out->proto();
  }
  static void expect_on_host(const proto::DataProto& d, const std::string& what) {
    for (const auto& [key, t] : d.batch()) EXPECT_TRUE(t.device().is_cpu()) << what << " '" << key << "' on " << t.device();
  }

  c10::Device device_ = kCpu;
  std::optional<proto::DeviceScope> scope_;
};

TEST_P(OnDevice, InitModelPutsEveryTensorOnTheWorkersDevice) {
  json c = arr_config();
  auto w = make_worker(ctx(0, 1, next_port()), "actor_rollout_ref", c);
  for (auto* module : {w->actor_module(), w->ref_module()}) {
    ASSERT_NE(module, nullptr);
    EXPECT_EQ(module->engine().device(), device_);
    Status st = check_on_device(module->engine(), device_, 0);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
}

TEST_P(OnDevice, RolloutMatchesTheCpuTokenForToken) {
  proto::DataProto prompts = make_prompts({3, 8, 5, 1}, 8, 31, kVocab);
  for (bool sample : {false, true}) {
    json c = arr_config();
    prompts.meta_info()["do_sample"] = sample;  // false: greedy, as verl's validation asks
    auto here = make_worker(ctx(0, 1, next_port()), "actor_rollout", c);
    auto cpu = make_worker(context(0, 1, next_port()), "actor_rollout", c);
    proto::DataProto got = call(*here, "generate_sequences", prompts);
    proto::DataProto want = call(*cpu, "generate_sequences", prompts);
    expect_on_host(got, "generate_sequences output");
    ASSERT_TRUE(got.tensor("responses").ok());
    EXPECT_TRUE(at::equal(*got.tensor("responses"), *want.tensor("responses")))
        << (sample ? "sampled" : "greedy") << " responses differ from the CPU's";
    EXPECT_LE(max_diff(*got.tensor("rollout_log_probs"), *want.tensor("rollout_log_probs")), 1e-4);
  }
}

// LoRA on the device (Note [LoRA adapters]): one update of the adapters through the method table
// moves the actor as on the CPU, the reference (the actor with its adapters off) stays the CPU's
// base model, and the rollout's merged weights give the actor's log-probs.
TEST_P(OnDevice, LoraActorMatchesTheCpuAndItsRolloutTheActor) {
  json c = arr_config();
  c["model"]["lora_rank"] = 4;
  c["model"]["lora_alpha"] = 8;
  c["actor"]["optim"]["lr"] = 5e-2;
  proto::DataProto batch = make_rollout({3, 5, 2, 4}, {4, 2, 6, 3}, 5, 6, 33, kVocab);
  batch.meta_info()["temperature"] = 1.0;
  std::vector<proto::DataProto> ref, updated, rollout;
  for (bool on_device : {true, false}) {
    auto w = make_worker(on_device ? ctx(0, 1, next_port()) : context(0, 1, next_port()), "actor_rollout_ref", c);
    proto::DataProto b = batch;
    ASSERT_TRUE(b.set_tensor("old_log_probs", *call(*w, "compute_log_prob", b).tensor("old_log_probs")).ok());
    ref.push_back(call(*w, "compute_ref_log_prob", b));
    call(*w, "update_actor", b);
    updated.push_back(call(*w, "compute_log_prob", b));
    rollout.push_back(call(*w, "generate_sequences", make_prompts({3, 8, 5, 1}, 8, 34, kVocab)));
    EXPECT_EQ(w->sharding_manager()->last_reshard().handoff_copied_bytes, 0);
    // The merge left the shards alone: the actor recomputes what it computed before generating.
    EXPECT_EQ(max_diff(*call(*w, "compute_log_prob", b).tensor("old_log_probs"), *updated.back().tensor("old_log_probs")),
              0.0);
  }
  EXPECT_LE(max_diff(*ref[0].tensor("ref_log_prob"), *ref[1].tensor("ref_log_prob")), 1e-4);
  EXPECT_LE(max_diff(*updated[0].tensor("old_log_probs"), *updated[1].tensor("old_log_probs")), 1e-4);
  EXPECT_GT(max_diff(*updated[0].tensor("old_log_probs"), *ref[0].tensor("ref_log_prob")), 1e-3);
  const proto::DataProto& out = rollout[0];
  at::Tensor mask = out.tensor("attention_mask")->narrow(1, 8, 6).to(at::kFloat);
  EXPECT_LE(((*out.tensor("rollout_log_probs") - *out.tensor("old_log_probs")) * mask).abs().max().item<double>(), 1e-4);
}

// free_cache_engine: the KV cache lives inside generate_sequences, so after the call the device
// holds what it held before (the caching allocator's allocated bytes; 0 == 0 on the CPU), while
// the call itself used more (its peak).
TEST_P(OnDevice, GenerationGivesItsMemoryBackOnExit) {
  proto::DataProto prompts = make_prompts({3, 8, 5, 1}, 8, 32, kVocab);
  auto w = make_worker(ctx(0, 1, next_port()), "actor_rollout", arr_config());
  call(*w, "generate_sequences", prompts);  // the first call also creates library handles
  proto::synchronize(device_);
  const int64_t before = proto::memory_stats(device_).allocated;
  proto::reset_peak_memory(device_);
  call(*w, "generate_sequences", prompts);
  proto::synchronize(device_);
  const proto::DeviceMemory after = proto::memory_stats(device_);
  EXPECT_EQ(after.allocated, before);
  if (device_.is_cuda()) {
    EXPECT_GT(after.max_allocated, before);
  }
}

// model.use_remove_padding through the worker on its device: the actor's and the reference's
// log-probs equal the padded path's on every response token (packing.hpp).
TEST_P(OnDevice, PaddingFreeLogProbsMatchPadded) {
  proto::DataProto batch = make_rollout({3, 5, 2, 4}, {4, 2, 6, 3}, 5, 6, 23, kVocab);
  batch.meta_info()["temperature"] = 1.0;
  at::Tensor mask = batch.tensor("response_mask")->to(at::kBool);
  for (bool dynamic : {false, true}) {  // dynamic: micro-batches cut by token budget, rows reordered
    json padded = arr_config();
    if (dynamic) {
      for (const char* role : {"rollout", "ref"}) {
        padded[role]["log_prob_use_dynamic_bsz"] = true;
        padded[role]["log_prob_max_token_len_per_gpu"] = 24;
      }
    }
    json packed = padded;
    packed["model"]["use_remove_padding"] = true;
    auto a = make_worker(ctx(0, 1, next_port()), "actor_rollout_ref", padded);
    auto b = make_worker(ctx(0, 1, next_port()), "actor_rollout_ref", packed);
    for (const char* method : {"compute_log_prob", "compute_ref_log_prob"}) {
      const char* key = std::string(method) == "compute_log_prob" ? "old_log_probs" : "ref_log_prob";
      proto::DataProto want = call(*a, method, batch), got = call(*b, method, batch);
      ASSERT_TRUE(want.tensor(key).ok() && got.tensor(key).ok()) << method;
      EXPECT_LE(max_diff(got.tensor(key)->masked_select(mask), want.tensor(key)->masked_select(mask)), 1e-4)
          << method << (dynamic ? " (dynamic)" : "");
    }
  }
}

TEST_P(OnDevice, FullShardAdamWStepOnTwoRanksMatchesTheCpu) {
  proto::DataProto batch = make_rollout({3, 5, 2, 4}, {4, 2, 6, 3}, 5, 6, 21, kVocab);
  batch.meta_info()["temperature"] = 1.0;
  // old_log_probs from the untrained model on the CPU: on-policy but for noise, as in verl.
  auto probe = make_worker(context(0, 1, next_port()), "actor", arr_config(4, 1));
  auto lp = probe->compute_log_prob(batch);
  ASSERT_TRUE(lp.ok()) << lp.status().to_string();
  ASSERT_TRUE(batch.set_tensor("old_log_probs", *lp->tensor("old_log_probs") - 0.1).ok());
  auto chunks = batch.chunk(2);
  ASSERT_TRUE(chunks.ok());
  auto run = [&](bool on_device) {
    std::vector<std::map<std::string, at::Tensor>> states(2);
    std::vector<double> grad_norms(2);
    const uint16_t port = next_port();
    run_ranks(2, [&](int r) {
      std::optional<proto::DeviceScope> scope;
      if (on_device) scope.emplace(device_);
      auto w = make_worker(on_device ? ctx(r, 2, port) : context(r, 2, port), "actor", arr_config(4, 1));
      proto::DataProto out = call(*w, "update_actor", (*chunks)[r]);
      grad_norms[r] = out.meta_info()["metrics"]["actor/grad_norm"].is_array()
                          ? out.meta_info()["metrics"]["actor/grad_norm"][0].get<double>()
                          : out.meta_info()["metrics"]["actor/grad_norm"].get<double>();
      EXPECT_TRUE(out.meta_info()["metrics"].contains("perf/max_memory_allocated_gb"));
      EXPECT_TRUE(out.meta_info()["metrics"].contains("perf/mfu/actor"));
      Status st = check_on_device(w->actor_module()->engine(), on_device ? device_ : kCpu, r);
      EXPECT_TRUE(st.ok()) << st.to_string();
      auto s = w->actor_module()->engine().full_state_dict(at::kFloat);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      for (auto& [name, t] : *s) states[r][name] = t.to(at::kCPU);
    });
    return std::make_pair(states, grad_norms);
  };
  auto [got, got_norms] = run(true);
  auto [want, want_norms] = run(false);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(got_norms[r], want_norms[r], 1e-5);
    for (const auto& [name, t] : want[r]) EXPECT_LE(max_diff(got[r].at(name), t), 1e-5) << name;
  }
}

TEST_P(OnDevice, OffloadRoundTripsKeepTheShardsOnTheDeviceBitwise) {
  json c = arr_config();
  c["actor"]["fsdp_config"] = fp32_fsdp(/*param_offload=*/true, /*optimizer_offload=*/true);
  auto w = make_worker(ctx(0, 1, next_port()), "actor", c);
  fsdp::FsdpModule& e = w->actor_module()->engine();
  ASSERT_TRUE(e.params_offloaded() && e.optimizer_offloaded());
  ASSERT_TRUE(e.load_params().ok());
  ASSERT_TRUE(e.load_optimizer().ok());
  std::vector<at::Tensor> before;
  for (size_t u = 0; u < e.layouts().size(); ++u) before.push_back(e.shard(static_cast<int>(u)).to(at::kCPU, false, true));
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(e.offload_params().ok());
    ASSERT_TRUE(e.offload_optimizer().ok());
    ASSERT_TRUE(e.load_params().ok());
    ASSERT_TRUE(e.load_optimizer().ok());
  }
  Status st = e.check_device(device_);
  EXPECT_TRUE(st.ok()) << st.to_string();
  for (size_t u = 0; u < before.size(); ++u) {
    const at::Tensor& now = e.shard(static_cast<int>(u));
    EXPECT_EQ(now.device(), device_);
    EXPECT_TRUE(at::equal(now.to(at::kCPU), before[u])) << "unit " << u;
  }
}

// Offload buffers hold exactly their bytes (page-locked for a GPU, not rounded up to a power of
// two as the caching host allocator would) and carry a device copy there and back bitwise, the
// asynchronous copies included.
TEST_P(OnDevice, OffloadBuffersHoldExactlyTheirBytes) {
  const int64_t n = (int64_t{1} << 20) + 12345;  // 4 MB and a bit: a power-of-two block would be 8 MB
  auto cached_pinned_bytes = [&]() -> int64_t {
    return device_.is_cuda() ? at::getHostAllocator(at::kCUDA)->get_stats().allocated_bytes.current : 0;
  };
  const int64_t cached_before = cached_pinned_bytes();
  at::Tensor buffer = proto::offload_buffer({n}, at::kFloat, device_);
  EXPECT_EQ(cached_pinned_bytes(), cached_before);  // not a (rounded) block of the caching host allocator
  EXPECT_EQ(buffer.device(), at::Device(at::kCPU));
  EXPECT_EQ(buffer.storage().nbytes(), static_cast<size_t>(n) * sizeof(float));
  EXPECT_EQ(buffer.is_pinned(), device_.is_cuda());
  const at::Tensor working = at::randn({n}, at::TensorOptions(device_));
  buffer.copy_(working, /*non_blocking=*/true);
  const at::Tensor back = at::empty_like(working);
  back.copy_(buffer, /*non_blocking=*/true);
  proto::synchronize(device_);
  EXPECT_TRUE(at::equal(back, working));
}

TEST_P(OnDevice, MethodsHandDataProtosBackOnTheHost) {
  auto w = make_worker(ctx(0, 1, next_port()), "actor_rollout_ref", arr_config());
  proto::DataProto batch = make_rollout({3, 5}, {4, 2}, 5, 6, 21, kVocab);
  batch.meta_info()["temperature"] = 1.0;
  expect_on_host(call(*w, "compute_log_prob", batch), "compute_log_prob output");
  expect_on_host(call(*w, "compute_ref_log_prob", batch), "compute_ref_log_prob output");
}

INSTANTIATE_TEST_SUITE_P(Devices, OnDevice, ::testing::Values("cpu:0", "cuda:0"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return i.param.substr(0, i.param.find(':'));
                         });

TEST(DevicePlacement, StateOffTheDeviceIsNamedAfterInit) {
  auto w = make_worker(context(0, 1, next_port()), "actor", arr_config());
  fsdp::FsdpModule& e = w->actor_module()->engine();
  ASSERT_TRUE(check_on_device(e, kCpu, 0).ok());
  // A shard left on another device (the meta device stands in for one a CPU machine lacks).
  const std::string unit = e.layouts().back().unit;
  e.unit_state(static_cast<int>(e.layouts().size()) - 1).shard = at::empty({0}, at::TensorOptions(at::kFloat).device(at::kMeta));
  Status st = check_on_device(e, kCpu, 0);
  ASSERT_FALSE(st.ok());
  for (const std::string& part : {std::string("rank 0"), "unit '" + unit + "'", std::string("on meta")}) {
    EXPECT_NE(st.message().find(part), std::string::npos) << st.to_string();
  }
}

TEST(DevicePlacement, ACudaWorkerWithoutThatGpuFailsInOneLine) {
  if (proto::cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  // The worker shell refuses the device before any role is built (runtime/worker_actor.cpp);
  // the check it runs names the device and what is missing.
  Status st = proto::require_device(*proto::parse_device("cuda:0"));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cuda:0"), std::string::npos);
  EXPECT_EQ(st.message().find('\n'), std::string::npos);
}

}  // namespace
}  // namespace tessera::workers
