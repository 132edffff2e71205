// kill -9 of a driver mid-run, then a restart with trainer.resume_mode=auto, ends with the same
// final metrics as an uninterrupted run with the same seed. The interrupted driver is a forked
// child (forked before this process starts any runtime or LibTorch thread) that SIGKILLs itself
// right after the checkpoint of step 2 is committed.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver/ppo_trainer.hpp"
#include "tests/driver/trainer_test_util.hpp"

namespace tessera::driver {
namespace {

using testing::TempDir;

std::vector<std::string> resume_overrides(const std::filesystem::path& data_dir, const std::filesystem::path& run_dir) {
  auto o = testing::tiny_ppo_overrides(data_dir, "grpo", 4);
  o.push_back("trainer.save_freq=1");
  o.push_back("trainer.test_freq=-1");
  o.push_back("trainer.val_before_train=false");
  o.push_back("trainer.resume_mode=auto");
  o.push_back("trainer.default_local_dir=" + run_dir.string());
  return o;
}

Result<Metrics> train(const std::vector<std::string>& overrides, int64_t die_after_step) {
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json cfg, load_config(ConfigKind::ppo, "", overrides));
  PpoTrainerOptions o;
  o.console = nullptr;
  o.progress = nullptr;
  if (die_after_step > 0) {
    o.after_step = [die_after_step](int64_t step, const Metrics&) {
      if (step == die_after_step) ::raise(SIGKILL);
      return Status();
    };
  }
  TESSERA_ASSIGN_OR_RETURN(auto t, RayPPOTrainer::create(std::move(cfg), testing::trainer_registry(), o));
  TESSERA_RETURN_IF_ERROR(t->init_workers());
  TESSERA_RETURN_IF_ERROR(t->fit());
  if (t->history().empty()) return make_error(ErrorCode::internal, "no step logged");
  return t->history().back().second;
}

TEST(TrainerResume, KillNineThenAutoResumeMatchesUninterruptedRun) {
  TempDir dir("resume");
  testing::make_tiny_run(dir.path());
  const auto killed_dir = dir.path() / "killed", clean_dir = dir.path() / "clean";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto r = train(resume_overrides(dir.path(), killed_dir), /*die_after_step=*/2);
    ::_exit(r.ok() ? 0 : 3);  // reaching here means the kill did not happen
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
  ASSERT_TRUE(std::filesystem::exists(killed_dir / "global_step_2" / "trainer_state.json"));

  auto resumed = train(resume_overrides(dir.path(), killed_dir), 0);
  ASSERT_TRUE(resumed.ok()) << resumed.status().to_string();
  auto clean = train(resume_overrides(dir.path(), clean_dir), 0);
  ASSERT_TRUE(clean.ok()) << clean.status().to_string();
  EXPECT_EQ(resumed->at("training/global_step"), 4);
  const Metrics a = testing::deterministic_metrics(*resumed), b = testing::deterministic_metrics(*clean);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, v] : b) {
    ASSERT_TRUE(a.count(k)) << k;
    EXPECT_NEAR(a.at(k), v, 1e-5 * (1 + std::abs(v))) << k;
  }
}

}  // namespace
}  // namespace tessera::driver
