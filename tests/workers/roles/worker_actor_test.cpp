// ActorRolloutRefWorker and CriticWorker driven directly (ranks as threads, in-process
// collectives): update_actor on 2 ranks == 1 rank on the same global batch (parameters and
// metrics); compute_log_prob invariant to micro-batch size and dynamic vs fixed batching and equal
// to an independent forward; the reference policy equals the untrained actor; a critic update
// lowers the value loss on a fixed batch; checkpoints round-trip.
#include <filesystem>

#include "tests/workers/roles/worker_test_util.hpp"
#include "workers/roles/actor_rollout_ref_worker.hpp"
#include "workers/roles/critic_worker.hpp"
#include "workers/roles/worker_support.hpp"
#include "workers/models/model_io.hpp"
#include "workers/ppo/ppo_inputs.hpp"

namespace tessera::workers {
namespace {

using namespace testing;  // NOLINT

// Independent log-probs of the responses: one full forward of the model file, log_softmax.
at::Tensor reference_log_probs(const proto::DataProto& d) {
  auto m = load_tiny_model();
  torch::NoGradGuard g;
  m->eval();
  at::Tensor ids = *d.tensor("input_ids"), responses = *d.tensor("responses");
  at::Tensor logits = m->forward(ids, *d.tensor("attention_mask"), *d.tensor("position_ids"));
  const int64_t T = ids.size(1), R = responses.size(1);
  at::Tensor z = logits.slice(1, T - R - 1, T - 1).to(at::kDouble);
  at::Tensor logp = z - z.logsumexp(-1, true);
  return logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1);
}

proto::DataProto training_batch(ActorRolloutRefWorker& w) {
  proto::DataProto batch = make_rollout({3, 5, 2, 4}, {4, 2, 6, 3}, 5, 6, 21, kVocab);
  auto lp = w.compute_log_prob(batch);
  EXPECT_TRUE(lp.ok()) << lp.status().to_string();
  at::Generator gen = at::detail::createCPUGenerator(5);
  at::Tensor mask = batch.tensor("response_mask")->to(at::kFloat);
  // Off-policy by up to ~0.3 nats so that the ratio is clipped for some tokens.
  at::Tensor old = *lp->tensor("old_log_probs") + 0.15 * at::randn(mask.sizes(), gen) * mask;
  EXPECT_TRUE(batch.set_tensor("old_log_probs", old).ok());
  batch.meta_info()["temperature"] = lp->meta_info().at("temperature");  // verl's union with the output
  return batch;
}

std::vector<double> metric(const proto::DataProto& out, const std::string& name) {
  const json& m = out.meta_info().at("metrics").at(name);
  if (m.is_number()) return {m.get<double>()};
  return m.get<std::vector<double>>();
}

// A device running out of memory inside a worker call is one line: the allocator's summary (what it
// tried to allocate, what was free) without its advice, and the keys that shrink that call; other
// errors pass unchanged.
TEST(WorkerSupport, OutOfMemoryIsOneLineNamingTheKeysThatShrinkTheCall) {
  const Status oom = [] {
    try {
      throw c10::OutOfMemoryError({"forward", "fake.cpp", 1},
                                  "CUDA out of memory. Tried to allocate 18.55 GiB. GPU 0 has a total capacity of "
                                  "79.19 GiB of which 3.12 GiB is free. Of the allocated memory 70.1 GiB is allocated "
                                  "by PyTorch.\nIf reserved but unallocated memory is large try setting "
                                  "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
    } catch (...) {
      return ppo::status_from_current_exception("FSDP forward");
    }
  }();
  EXPECT_EQ(oom.code(), ErrorCode::resource_exhausted);
  const Status named = name_memory_keys(oom, micro_batch_key("actor_rollout_ref.actor.ppo", /*dynamic=*/false));
  const std::string message = named.to_string();
  EXPECT_NE(message.find("Tried to allocate 18.55 GiB"), std::string::npos) << message;
  EXPECT_NE(message.find("3.12 GiB is free"), std::string::npos) << message;
  EXPECT_NE(message.find("lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"), std::string::npos) << message;
  EXPECT_EQ(message.find("PYTORCH_CUDA_ALLOC_CONF"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(micro_batch_key("critic.forward", /*dynamic=*/true), "critic.forward_max_token_len_per_gpu");
  const Status other = make_error(ErrorCode::invalid_argument, "meta_info.temperature is required");
  EXPECT_EQ(name_memory_keys(other, "x").to_string(), other.to_string());
}

TEST(ActorRolloutRefWorker, UpdateActorOnTwoRanksEqualsOneRank) {
  auto one = make_worker(context(0, 1, next_port()), "actor", arr_config(/*mini=*/4, /*micro=*/1));
  proto::DataProto batch = training_batch(*one);
  auto out1 = one->update_actor(batch);
  ASSERT_TRUE(out1.ok()) << out1.status().to_string();
  auto want = one->actor_module()->engine().full_state_dict(at::kFloat);
  ASSERT_TRUE(want.ok());

  auto chunks = batch.chunk(2);
  ASSERT_TRUE(chunks.ok());
  const uint16_t port = next_port();
  std::vector<proto::DataProto> outs(2);
  std::vector<std::map<std::string, at::Tensor>> states(2);
  run_ranks(2, [&](int r) {
    auto w = make_worker(context(r, 2, port), "actor", arr_config(4, 1));
    auto out = w->update_actor((*chunks)[r]);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    outs[r] = *out;
    auto s = w->actor_module()->engine().full_state_dict(at::kFloat);
    ASSERT_TRUE(s.ok());
    states[r] = *s;
  });
  for (const auto& [name, t] : *want) {
    EXPECT_LE(max_diff(states[0].at(name), t), 1e-5) << name;
    EXPECT_LE(max_diff(states[1].at(name), t), 1e-5) << name;
  }
  // Per-micro-batch metrics: rank 0's rows then rank 1's, as the 1-rank run saw them in order.
  for (const char* name : {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl"}) {
    std::vector<double> got = metric(outs[0], name), rest = metric(outs[1], name);
    got.insert(got.end(), rest.begin(), rest.end());
    std::vector<double> expect = metric(*out1, name);
    ASSERT_EQ(got.size(), expect.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expect[i], 1e-5) << name << "[" << i << "]";
  }
  EXPECT_GT(metric(*out1, "actor/pg_clipfrac")[0] + metric(*out1, "actor/pg_clipfrac")[2], 0.0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(metric(outs[r], "actor/grad_norm")[0], metric(*out1, "actor/grad_norm")[0], 1e-5);
    EXPECT_EQ(metric(outs[r], "actor/lr")[0], metric(*out1, "actor/lr")[0]);
    EXPECT_GT(metric(outs[r], "perf/cpu_memory_used_gb")[0], 0.0);
  }
}

// model.enable_activation_offload (Note [Activation offload]): with gradient checkpointing the
// actor trains as without it; without checkpointing it is refused at init, naming both keys.
TEST(ActorRolloutRefWorker, ActivationOffloadTrainsAsWithoutItAndNeedsCheckpointing) {
  std::vector<std::map<std::string, at::Tensor>> states;
  for (bool offload : {false, true}) {
    json c = arr_config(4, 1);
    c["model"]["enable_gradient_checkpointing"] = true;
    c["model"]["enable_activation_offload"] = offload;
    auto w = make_worker(context(0, 1, next_port()), "actor", c);
    EXPECT_EQ(w->actor_module()->engine().options().offload_activations, offload);
    auto out = w->update_actor(training_batch(*w));
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    auto s = w->actor_module()->engine().full_state_dict(at::kFloat);
    ASSERT_TRUE(s.ok());
    states.push_back(*s);
  }
  for (const auto& [name, t] : states[0]) EXPECT_TRUE(at::equal(states[1].at(name), t)) << name;
  json c = arr_config(4, 1);
  c["model"]["enable_activation_offload"] = true;
  auto w = ActorRolloutRefWorker::create(context(0, 1, next_port()),
                                         json{{"role", "actor"}, {"config", c}, {"comm_backend", "inproc"}});
  ASSERT_TRUE(w.ok());
  Status st = (*w)->init_model();
  EXPECT_NE(st.message().find("actor_rollout_ref.model.enable_activation_offload = true requires "
                              "actor_rollout_ref.model.enable_gradient_checkpointing = true"),
            std::string::npos) << st.message();
  // A wrapping that recomputes no layer (size-based: no unit is a whole layer) has nothing to offload.
  c["model"]["enable_gradient_checkpointing"] = true;
  c["actor"]["fsdp_config"]["wrap_policy"] = {{"min_num_params", 300}};
  w = ActorRolloutRefWorker::create(context(0, 1, next_port()),
                                    json{{"role", "actor"}, {"config", c}, {"comm_backend", "inproc"}});
  ASSERT_TRUE(w.ok());
  st = (*w)->init_model();
  EXPECT_NE(st.message().find("actor_rollout_ref.model.enable_activation_offload = true: "
                              "actor_rollout_ref.actor.fsdp_config recomputes no layer in backward (size-based wrapping)"),
            std::string::npos) << st.message();
  // The critic names its own keys; a reference that never trains has nothing to offload.
  auto critic = CriticWorker::create(context(0, 1, next_port()),
                                     json{{"config", {{"model", {{"path", tiny_model_dir()},
                                                                 {"enable_activation_offload", true},
                                                                 {"fsdp_config", fp32_fsdp()}}},
                                                      {"optim", {{"lr", 1e-2}}},
                                                      {"ppo_mini_batch_size", 4},
                                                      {"ppo_micro_batch_size_per_gpu", 2}}},
                                          {"comm_backend", "inproc"}});
  ASSERT_TRUE(critic.ok());
  st = (*critic)->init_model();
  EXPECT_NE(st.message().find("critic.model.enable_activation_offload = true requires "
                              "critic.model.enable_gradient_checkpointing = true"), std::string::npos) << st.message();
  json ref = arr_config(4, 1);
  ref["model"]["enable_activation_offload"] = true;
  auto r = make_worker(context(0, 1, next_port()), "ref", ref);
  ASSERT_NE(r, nullptr);
}

// actor_rollout_ref.nccl_timeout: the group's collectives wait that long for their peers (the
// world communicator's default timeout); below 1 second it is refused naming the key.
TEST(ActorRolloutRefWorker, NcclTimeoutIsTheGroupsCollectiveTimeout) {
  json c = arr_config(4, 1);
  c["nccl_timeout"] = 7;
  auto w = make_worker(context(0, 1, next_port()), "actor", c);
  EXPECT_EQ(w->actor_module()->engine().mesh().world()->default_timeout(), std::chrono::milliseconds(7000));
  auto parsed = parse_actor_rollout_ref_config(json{{"role", "actor"}, {"config", arr_config(4, 1)}}, 1);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->nccl_timeout, std::chrono::seconds(600));  // verl's default
  c["nccl_timeout"] = 0;
  auto bad = parse_actor_rollout_ref_config(json{{"role", "actor"}, {"config", c}}, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("actor_rollout_ref.nccl_timeout = 0 must be >= 1"), std::string::npos)
      << bad.status().message();
}

TEST(ActorRolloutRefWorker, ComputeLogProbIsInvariantToMicroBatchingAndMatchesAForward) {
  proto::DataProto batch = make_rollout({3, 5, 2, 4, 1}, {4, 2, 6, 3, 5}, 5, 6, 22, kVocab);
  at::Tensor want = reference_log_probs(batch);
  std::vector<json> variants;
  for (int64_t micro : {1, 3, 5}) {
    json c = arr_config();
    c["rollout"]["log_prob_micro_batch_size_per_gpu"] = micro;
    variants.push_back(c);
  }
  json dyn = arr_config();
  dyn["rollout"]["log_prob_use_dynamic_bsz"] = true;
  dyn["rollout"]["log_prob_max_token_len_per_gpu"] = 24;  // 2 rows of 11 tokens per micro-batch
  variants.push_back(dyn);
  for (size_t v = 0; v < variants.size(); ++v) {
    auto w = make_worker(context(0, 1, next_port()), "actor", variants[v]);
    auto out = w->compute_log_prob(batch);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_LE(max_diff(*out->tensor("old_log_probs"), want), 1e-5) << "variant " << v;
    EXPECT_EQ(out->tensor("entropys")->sizes(), want.sizes());
    EXPECT_EQ(out->meta_info().at("temperature"), 1.0);
    EXPECT_GE(out->meta_info().at("metrics").at("timing_s/compute_log_prob").get<double>(), 0.0);
  }
}

TEST(ActorRolloutRefWorker, ReferencePolicyEqualsTheUntrainedActorAndStaysOffloaded) {
  proto::DataProto batch = make_rollout({3, 5, 2, 4}, {4, 2, 6, 3}, 5, 6, 23, kVocab);
  auto w = make_worker(context(0, 1, next_port()), "actor_rollout_ref", arr_config());
  ASSERT_TRUE(w->ref_module()->engine().params_offloaded());
  auto ref = w->compute_ref_log_prob(batch);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  EXPECT_LE(max_diff(*ref->tensor("ref_log_prob"), reference_log_probs(batch)), 1e-5);
  EXPECT_TRUE(w->ref_module()->engine().params_offloaded());
  auto actor_only = make_worker(context(0, 1, next_port()), "actor", arr_config());
  auto missing = actor_only->compute_ref_log_prob(batch);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("role 'actor'"), std::string::npos);
}

// verl's model dtypes: the trained actor keeps fp32 master weights, the reference it never trains
// is bf16 unless its fsdp_config.model_dtype says otherwise (half the host memory it is offloaded
// to, half the bytes loaded per call).
TEST(ActorRolloutRefWorker, TheReferenceDefaultsToBf16WeightsAsInVerl) {
  json c = arr_config();
  c["actor"]["fsdp_config"].erase("model_dtype");
  c["ref"]["fsdp_config"].erase("model_dtype");
  auto w = make_worker(context(0, 1, next_port()), "actor_rollout_ref", c);
  EXPECT_EQ(w->actor_module()->engine().options().model_dtype, at::kFloat);
  EXPECT_EQ(w->ref_module()->engine().options().model_dtype, at::kBFloat16);
  c["ref"]["fsdp_config"]["model_dtype"] = "fp32";
  auto explicit_fp32 = make_worker(context(0, 1, next_port()), "actor_rollout_ref", c);
  EXPECT_EQ(explicit_fp32->ref_module()->engine().options().model_dtype, at::kFloat);
  // bf16 weights of the same model: log-probs within bf16 rounding of the fp32 reference's.
  proto::DataProto batch = make_rollout({3, 5}, {4, 2}, 5, 6, 24, kVocab);
  auto bf16 = w->compute_ref_log_prob(batch), fp32 = explicit_fp32->compute_ref_log_prob(batch);
  ASSERT_TRUE(bf16.ok() && fp32.ok());
  const double diff = max_diff(*bf16->tensor("ref_log_prob"), *fp32->tensor("ref_log_prob"));
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(diff, 0.05);
}

TEST(ActorRolloutRefWorker, OffloadedActorIsLoadedAroundEachCall) {
  json c = arr_config();
  c["actor"]["fsdp_config"] = fp32_fsdp(/*param_offload=*/true, /*optimizer_offload=*/true);
  auto w = make_worker(context(0, 1, next_port()), "actor", c);
  auto& e = w->actor_module()->engine();
  ASSERT_TRUE(e.params_offloaded() && e.optimizer_offloaded());
  proto::DataProto batch = training_batch(*w);
  auto out = w->update_actor(batch);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(e.params_offloaded() && e.optimizer_offloaded());
  // The update happened: the parameters moved away from the file's.
  EXPECT_GT(metric(*out, "actor/grad_norm")[0], 0.0);
  auto after = w->compute_log_prob(batch);
  ASSERT_TRUE(after.ok());
  EXPECT_GT(max_diff(*after->tensor("old_log_probs"), reference_log_probs(batch)), 1e-4);
}

TEST(ActorRolloutRefWorker, CheckpointRoundTripsAndRotates) {
  char tmpl[] = "/tmp/tessera_arr_ckpt_XXXXXX";
  const std::string root = mkdtemp(tmpl);
  auto w = make_worker(context(0, 1, next_port()), "actor", arr_config());
  proto::DataProto batch = training_batch(*w);
  ASSERT_TRUE(w->update_actor(batch).ok());
  auto trained = w->compute_log_prob(batch);
  ASSERT_TRUE(w->save_checkpoint({root + "/global_step_1", std::nullopt, 1, 1}).ok());
  EXPECT_TRUE(std::filesystem::exists(root + "/global_step_1/huggingface/tokenizer.json"));
  auto fresh = make_worker(context(0, 1, next_port()), "actor", arr_config());
  ASSERT_TRUE(fresh->load_checkpoint({root + "/global_step_1", std::nullopt, false}).ok());
  auto loaded = fresh->compute_log_prob(batch);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(max_diff(*loaded->tensor("old_log_probs"), *trained->tensor("old_log_probs")), 0.0);
  ASSERT_TRUE(w->save_checkpoint({root + "/global_step_2", std::nullopt, 2, 1}).ok());
  EXPECT_FALSE(std::filesystem::exists(root + "/global_step_1"));  // max_ckpt_to_keep = 1
  Status hdfs = w->save_checkpoint({root + "/x", std::string("hdfs://x"), 3, std::nullopt});
  EXPECT_EQ(hdfs.code(), ErrorCode::unimplemented);
  std::filesystem::remove_all(root);
}

json critic_config() {
  return {{"model", {{"path", tiny_model_dir()}, {"fsdp_config", fp32_fsdp()}}},
          {"optim", {{"lr", 5e-3}}},
          {"rollout_n", 1},
          {"ppo_mini_batch_size", 4},
          {"ppo_micro_batch_size_per_gpu", 2},
          {"cliprange_value", 0.5},
          {"grad_clip", 1.0}};
}

TEST(CriticWorker, UpdatesLowerTheValueLossOnAFixedBatch) {
  auto w = CriticWorker::create(context(0, 1, next_port()),
                                json{{"config", critic_config()}, {"seed", 1}, {"comm_backend", "inproc"}});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->init_model().ok());
  proto::DataProto batch = make_rollout({3, 5, 2, 4}, {4, 2, 6, 3}, 5, 6, 24, kVocab);
  auto values = (*w)->compute_values(batch);
  ASSERT_TRUE(values.ok()) << values.status().to_string();
  at::Tensor v = *values->tensor("values");
  ASSERT_EQ(v.sizes(), (at::IntArrayRef{4, 6}));
  EXPECT_TRUE(values->meta_info().at("metrics").contains("timing_s/compute_values"));
  at::Tensor mask = batch.tensor("response_mask")->to(at::kFloat);
  EXPECT_EQ((v * (1 - mask)).abs().sum().item<float>(), 0.0f);  // values x response mask
  ASSERT_TRUE(batch.set_tensor("values", v).ok());
  ASSERT_TRUE(batch.set_tensor("returns", (v + 0.3) * mask).ok());
  std::vector<double> losses;
  for (int step = 0; step < 6; ++step) {
    auto out = (*w)->update_critic(batch);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    auto l = metric(*out, "critic/vf_loss");
    losses.push_back((l[0] + l[1]) / 2);
    EXPECT_GT(metric(*out, "critic/lr")[0], 0.0);
  }
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << losses.front() << " -> " << losses.back();
}

TEST(CriticWorker, BadBatchSizesAreRefusedAtInit) {
  json c = critic_config();
  c["ppo_mini_batch_size"] = 3;
  auto w = CriticWorker::create(context(0, 2, next_port()), json{{"config", c}, {"comm_backend", "inproc"}});
  ASSERT_TRUE(w.ok());
  Status st = (*w)->init_model();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("critic.ppo_mini_batch_size"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace tessera::workers
