// Checkpoint bookkeeping (driver/checkpoint_manager.hpp).
#include "driver/checkpoint_manager.hpp"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <fstream>
#include <sstream>
#include <system_error>

#include "driver/config.hpp"
#include "proto/atomic_file.hpp"

namespace tessera::driver {
namespace {

namespace fs = std::filesystem;

constexpr const char* kMarker = "latest_checkpointed_iteration.txt";
constexpr const char* kDataState = "data.json";
constexpr const char* kTrainerState = "trainer_state.json";
constexpr const char* kStepPrefix = "global_step_";

Result<nlohmann::json> read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::not_found, "cannot open {}", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(ErrorCode::corrupt_data, "{}: not valid JSON", path.string());
  return j;
}

bool keep_all(const std::optional<int64_t>& keep) { return !keep || *keep <= 0; }

Status remove_tree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return make_error(ErrorCode::io_error, "cannot remove {}: {}", path.string(), ec.message());
  return Status();
}

}  // namespace

Result<int64_t> parse_global_step(const fs::path& dir) {
  std::string name = (dir.has_filename() ? dir : dir.parent_path()).filename().string();
  if (name.rfind(kStepPrefix, 0) != 0) {
    return make_error(ErrorCode::invalid_argument, "{} is not a global_step_N directory", dir.string());
  }
  std::string digits = name.substr(std::string(kStepPrefix).size());
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) {
    return make_error(ErrorCode::invalid_argument, "{}: '{}' is not a step number", dir.string(), digits);
  }
  return static_cast<int64_t>(std::stoll(digits));
}

Result<CheckpointOptions> CheckpointOptions::from_config(const nlohmann::json& cfg) {
  CheckpointOptions o;
  TESSERA_ASSIGN_OR_RETURN(std::string dir, config_get<std::string>(cfg, "trainer.default_local_dir"));
  o.default_local_dir = dir;
  if (config_find(cfg, "trainer.max_ckpt_to_keep") != nullptr) {  // SFT trainer
    TESSERA_ASSIGN_OR_RETURN(o.max_actor_ckpt_to_keep, config_get<std::optional<int64_t>>(cfg, "trainer.max_ckpt_to_keep"));
    o.max_critic_ckpt_to_keep = o.max_actor_ckpt_to_keep;
  } else {
    TESSERA_ASSIGN_OR_RETURN(o.max_actor_ckpt_to_keep,
                             config_get<std::optional<int64_t>>(cfg, "trainer.max_actor_ckpt_to_keep"));
    TESSERA_ASSIGN_OR_RETURN(o.max_critic_ckpt_to_keep,
                             config_get<std::optional<int64_t>>(cfg, "trainer.max_critic_ckpt_to_keep"));
  }
  TESSERA_ASSIGN_OR_RETURN(o.resume_mode, config_get<std::string>(cfg, "trainer.resume_mode"));
  TESSERA_ASSIGN_OR_RETURN(o.resume_from_path, config_get<std::optional<std::string>>(cfg, "trainer.resume_from_path"));
  if (o.resume_mode != "auto" && o.resume_mode != "resume_path" && o.resume_mode != "disable") {
    return make_error(ErrorCode::invalid_argument, "trainer.resume_mode = '{}' is not one of: auto, resume_path, disable",
                      o.resume_mode);
  }
  return o;
}

fs::path CheckpointManager::step_dir(int64_t step) const {
  return options_.default_local_dir / fmt::format("{}{}", kStepPrefix, step);
}

fs::path CheckpointManager::marker_path() const { return options_.default_local_dir / kMarker; }

Result<fs::path> CheckpointManager::begin_save(int64_t step) {
  if (step < 1) return make_error(ErrorCode::invalid_argument, "checkpoint step {} must be >= 1", step);
  fs::path dir = step_dir(step);
  TESSERA_ASSIGN_OR_RETURN(auto latest, latest_checkpointed_iteration());
  std::error_code ec;
  bool complete = fs::exists(dir / kTrainerState, ec) && latest && step <= *latest;
  if (fs::exists(dir, ec) && !complete) TESSERA_RETURN_IF_ERROR(remove_tree(dir));  // a crash's leftover
  fs::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::io_error, "cannot create {}: {}", dir.string(), ec.message());
  return dir;
}

Status CheckpointManager::write_driver_state(int64_t step, const nlohmann::json& dataloader_state,
                                             const nlohmann::json& trainer_state) {
  fs::path dir = step_dir(step);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return make_error(ErrorCode::not_found, "{} does not exist (call begin_save first)", dir.string());
  }
  TESSERA_RETURN_IF_ERROR(proto::write_file_atomic((dir / kDataState).string(), dataloader_state.dump(2) + "\n"));
  return proto::write_file_atomic((dir / kTrainerState).string(), trainer_state.dump(2) + "\n");
}

Status CheckpointManager::commit(int64_t step) {
  fs::path state = step_dir(step) / kTrainerState;
  std::error_code ec;
  if (!fs::exists(state, ec)) {
    return make_error(ErrorCode::invalid_argument, "cannot commit step {}: {} is missing", step, state.string());
  }
  TESSERA_RETURN_IF_ERROR(proto::write_file_atomic(marker_path().string(), std::to_string(step)));
  return prune();
}

Result<std::optional<int64_t>> CheckpointManager::latest_checkpointed_iteration() const {
  fs::path path = marker_path();
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<int64_t>();
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (text.empty() || text.size() > 18 || !std::all_of(text.begin(), text.end(), ::isdigit)) {
    return make_error(ErrorCode::corrupt_data, "{}: expected a step number, got '{}'", path.string(), text.substr(0, 40));
  }
  return std::optional<int64_t>(std::stoll(text));
}

Result<std::vector<int64_t>> CheckpointManager::complete_steps() const {
  TESSERA_ASSIGN_OR_RETURN(auto latest, latest_checkpointed_iteration());
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!latest || !fs::is_directory(options_.default_local_dir, ec)) return steps;
  for (const auto& entry : fs::directory_iterator(options_.default_local_dir, ec)) {
    if (!entry.is_directory()) continue;
    auto step = parse_global_step(entry.path());
    if (step.ok() && *step <= *latest && fs::exists(entry.path() / kTrainerState)) steps.push_back(*step);
  }
  if (ec) return make_error(ErrorCode::io_error, "cannot list {}: {}", options_.default_local_dir.string(), ec.message());
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Keeps the newest `keep` actor/ (critic/) dirs among complete steps; a step dir left with
// neither is removed whole. The newest step is never touched.
Status CheckpointManager::prune() {
  TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> steps, complete_steps());
  auto prune_sub = [&](const char* sub, const std::optional<int64_t>& keep) -> Status {
    if (keep_all(keep)) return Status();
    std::vector<int64_t> with;
    for (int64_t s : steps) {
      if (fs::exists(step_dir(s) / sub)) with.push_back(s);
    }
    const int64_t excess = static_cast<int64_t>(with.size()) - *keep;
    for (int64_t i = 0; i < excess; ++i) TESSERA_RETURN_IF_ERROR(remove_tree(step_dir(with[static_cast<size_t>(i)]) / sub));
    return Status();
  };
  TESSERA_RETURN_IF_ERROR(prune_sub("actor", options_.max_actor_ckpt_to_keep));
  TESSERA_RETURN_IF_ERROR(prune_sub("critic", options_.max_critic_ckpt_to_keep));
  if (keep_all(options_.max_actor_ckpt_to_keep) && keep_all(options_.max_critic_ckpt_to_keep)) return Status();
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    fs::path dir = step_dir(steps[i]);
    if (!fs::exists(dir / "actor") && !fs::exists(dir / "critic")) TESSERA_RETURN_IF_ERROR(remove_tree(dir));
  }
  return Status();
}

Result<std::optional<ResumePoint>> CheckpointManager::resolve_resume() const {
  fs::path dir;
  if (options_.resume_mode == "disable") return std::optional<ResumePoint>();
  if (options_.resume_mode == "auto") {
    TESSERA_ASSIGN_OR_RETURN(auto latest, latest_checkpointed_iteration());
    if (!latest) return std::optional<ResumePoint>();  // training from scratch
    dir = step_dir(*latest);
  } else if (options_.resume_mode == "resume_path") {
    if (!options_.resume_from_path || options_.resume_from_path->find(kStepPrefix) == std::string::npos) {
      return make_error(ErrorCode::invalid_argument,
                        "trainer.resume_mode=resume_path needs trainer.resume_from_path naming a global_step_N "
                        "directory, got '{}'", options_.resume_from_path.value_or("null"));
    }
    dir = fs::path(*options_.resume_from_path);
    if (dir.is_relative()) dir = fs::current_path() / dir;
  } else {
    return make_error(ErrorCode::invalid_argument, "trainer.resume_mode = '{}' is not one of: auto, resume_path, disable",
                      options_.resume_mode);
  }
  ResumePoint point;
  TESSERA_ASSIGN_OR_RETURN(point.global_step, parse_global_step(dir));
  point.step_dir = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return make_error(ErrorCode::not_found, "checkpoint {} does not exist", dir.string());
  if (!fs::exists(dir / kTrainerState, ec)) {
    return make_error(ErrorCode::corrupt_data, "checkpoint {} is incomplete (no {})", dir.string(), kTrainerState);
  }
  TESSERA_ASSIGN_OR_RETURN(point.trainer_state, read_json(dir / kTrainerState));
  if (fs::exists(dir / kDataState, ec)) {
    TESSERA_ASSIGN_OR_RETURN(point.dataloader_state, read_json(dir / kDataState));
  }
  return std::optional<ResumePoint>(std::move(point));
}

}  // namespace tessera::driver
