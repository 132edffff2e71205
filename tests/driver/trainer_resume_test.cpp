// kill -9 of a driver mid-run, then a restart with trainer.resume_mode=auto, ends with the same
// final metrics as an uninterrupted run with the same seed. The interrupted driver is this binary
// re-executed (fork + exec, TrainerResumeChild): it SIGKILLs itself right after the checkpoint of
// step 2 is committed. A bare fork is not enough: by then earlier tests have started LibTorch's
// and the runtime's threads, and a forked copy of them is undefined (LibTorch 2.11's CUDA build
// crashed in the child; Debian's 1.13 happened to work).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver/ppo_trainer.hpp"
#include "tests/driver/trainer_test_util.hpp"

namespace tessera::driver {
namespace {

using testing::TempDir;

constexpr const char* kChildDirEnv = "TESSERA_RESUME_CHILD_DIR";

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
  // The child's environment is built before fork: only execve runs in the child.
  std::vector<std::string> env_text = {std::string(kChildDirEnv) + "=" + dir.path().string()};
  for (char** e = environ; *e != nullptr; ++e) env_text.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  const char* argv[] = {"/proc/self/exe", "--gtest_filter=TrainerResumeChild.*", nullptr};
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::execve("/proc/self/exe", const_cast<char* const*>(argv), envp.data());
    ::_exit(127);
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

// The interrupted driver (TrainerResume runs it in a fresh process): trains the run of
// $TESSERA_RESUME_CHILD_DIR into its killed/ folder and SIGKILLs itself after step 2's checkpoint.
TEST(TrainerResumeChild, KillsItselfAfterTheCheckpointOfStep2) {
  const char* dir = std::getenv(kChildDirEnv);
  if (dir == nullptr) GTEST_SKIP() << "child mode only";
  ::alarm(120);
  const std::filesystem::path data(dir);
  auto r = train(resume_overrides(data, data / "killed"), /*die_after_step=*/2);
  FAIL() << "the kill did not happen: " << (r.ok() ? std::string("the run finished") : r.status().to_string());
}

}  // namespace
}  // namespace tessera::driver
