// N-rank FSDP training equals a single-process LibTorch run (torch::optim::AdamW,
// clip_grad_norm_, the same cosine schedule) within 1e-5 relative, for every strategy, at world
// sizes 2 and 4 (threads, in-process backend) and on Gloo; HYBRID_SHARD on a 2x2 mesh.
#include "tests/workers/fsdp/fsdp_test_util.hpp"

namespace tessera::fsdp {
namespace {

using namespace testing;
constexpr int kSteps = 5;
constexpr double kTolerance = 1e-5;

struct Case {
  std::string backend;
  int world;
  ShardingStrategy strategy;
  bool recompute;
  int fsdp_size;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return fmt::format("{}_{}_world{}{}{}", to_string(c.strategy), c.backend, c.world,
                     c.recompute ? "_recompute" : "", c.fsdp_size > 0 ? "_fsdp" + std::to_string(c.fsdp_size) : "");
}

class FsdpEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(FsdpEquivalence, MatchesSingleProcessOverFiveAdamWSteps) {
  const Case c = GetParam();
  RunResult want = reference_run(kSteps);
  std::vector<RunResult> got(c.world);
  collective::testing::with_world(c.backend, c.world, [&](int rank, collective::Communicator& w) {
    auto world = std::shared_ptr<collective::Communicator>(&w, [](collective::Communicator*) {});
    auto engine = make_engine(world, c.strategy, c.recompute, c.fsdp_size);
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(engine->shard_count(), c.strategy == ShardingStrategy::no_shard ? 1
                                     : c.fsdp_size > 0 ? c.fsdp_size : c.world);
    for (int s = 0; s < kSteps; ++s) {
      StepResult step;
      got[rank].losses.push_back(fsdp_step(*engine, w, s, c.recompute, &step));
      got[rank].grad_norms.push_back(step.grad_norm);
    }
    auto params = engine->full_state_dict(at::kFloat);
    ASSERT_TRUE(params.ok()) << params.status().to_string();
    got[rank].params = *params;
  });
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(got[r].losses.size(), want.losses.size());
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(got[r].losses[s], want.losses[s], kTolerance * std::abs(want.losses[s]))
          << "rank " << r << " step " << s;
      EXPECT_NEAR(got[r].grad_norms[s], want.grad_norms[s], kTolerance * want.grad_norms[s])
          << "grad norm, rank " << r << " step " << s;
    }
    double err = max_relative_error(got[r].params, want.params);
    EXPECT_LE(err, kTolerance) << "rank " << r << " max relative parameter error " << err;
  }
  // The run actually trained: the parameters moved away from their initial values.
  auto initial = make_model();
  std::map<std::string, at::Tensor> init;
  for (const auto& item : initial->named_parameters()) init[item.key()] = item.value().detach();
  EXPECT_GT(max_relative_error(got[0].params, init), 1e-3);
}

using S = ShardingStrategy;
INSTANTIATE_TEST_SUITE_P(
    Strategies, FsdpEquivalence,
    ::testing::Values(Case{"inproc", 2, S::full_shard, true, -1}, Case{"inproc", 4, S::full_shard, true, -1},
                      Case{"inproc", 2, S::full_shard, false, -1},
                      Case{"inproc", 2, S::shard_grad_op, false, -1},
                      Case{"inproc", 4, S::shard_grad_op, true, -1},
                      Case{"inproc", 2, S::no_shard, false, -1}, Case{"inproc", 4, S::no_shard, true, -1},
                      Case{"inproc", 4, S::hybrid_shard, true, 2}, Case{"inproc", 4, S::hybrid_shard, false, 2},
                      Case{"gloo", 2, S::full_shard, true, -1}, Case{"gloo", 4, S::hybrid_shard, true, 2}),
    case_name);

TEST(FsdpSingleRank, WorldOfOneMatchesToo) {
  RunResult want = reference_run(3);
  collective::testing::with_world("inproc", 1, [&](int, collective::Communicator& w) {
    auto world = std::shared_ptr<collective::Communicator>(&w, [](collective::Communicator*) {});
    auto engine = make_engine(world, S::full_shard, true);
    for (int s = 0; s < 3; ++s) EXPECT_NEAR(fsdp_step(*engine, w, s, true), want.losses[s], 1e-5);
    EXPECT_LE(max_relative_error(*engine->full_state_dict(at::kFloat), want.params), kTolerance);
  });
}

TEST(FsdpMixedPrecision, Bf16ParamDtypeTrains) {
  OptimizerOptions o = test_optim();
  o.schedule.kind = LrScheduleKind::constant;
  o.schedule.warmup_steps = 0;
  o.clip_grad = 1.0;
  collective::testing::with_world("inproc", 2, [&](int, collective::Communicator& w) {
    auto world = std::shared_ptr<collective::Communicator>(&w, [](collective::Communicator*) {});
    auto engine = make_engine(world, S::full_shard, true, -1, at::kBFloat16, o);
    EXPECT_EQ(engine->shard(0).scalar_type(), at::kFloat);  // master weights stay fp32
    std::vector<double> losses;
    for (int s = 0; s < 15; ++s) losses.push_back(fsdp_step(*engine, w, /*same batch*/ 0, true));
    EXPECT_LT(losses.back(), 0.8 * losses.front()) << losses.front() << " -> " << losses.back();
    for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  });
}

TEST(FsdpStep, NonFiniteNormSkipsTheStepOnEveryRank) {
  collective::testing::with_world("inproc", 2, [&](int rank, collective::Communicator& w) {
    auto world = std::shared_ptr<collective::Communicator>(&w, [](collective::Communicator*) {});
    auto engine = make_engine(world, S::full_shard, false);
    fsdp_step(*engine, w, 0, false);
    at::Tensor before = engine->shard(0).clone();
    StepResult r;
    // Only rank 1's loss is NaN; averaging spreads it, so both ranks must skip together.
    fsdp_step(*engine, w, 1, false, &r, rank == 1 ? std::nan("") : 1.0);
    EXPECT_TRUE(r.skipped);
    EXPECT_FALSE(std::isfinite(r.grad_norm));
    EXPECT_EQ(r.optimizer_steps, 1);
    EXPECT_TRUE(at::equal(before, engine->shard(0)));
    fsdp_step(*engine, w, 2, false, &r);
    EXPECT_FALSE(r.skipped);
    EXPECT_EQ(r.optimizer_steps, 2);
    EXPECT_TRUE(std::isfinite(r.grad_norm));
    EXPECT_FALSE(at::equal(before, engine->shard(0)));
  });
}

}  // namespace
}  // namespace tessera::fsdp
