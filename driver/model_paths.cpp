// model_paths.cpp: expand_user and resolve_model_paths (see model_paths.hpp).
#include "driver/model_paths.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <vector>

namespace tessera::driver {
namespace {

namespace fs = std::filesystem;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

std::optional<fs::path> hub_cache() {
  if (const char* c = env("HF_HUB_CACHE")) return fs::path(expand_user(c));
  if (const char* h = env("HF_HOME")) return fs::path(expand_user(h)) / "hub";
  if (const char* x = env("XDG_CACHE_HOME")) return fs::path(x) / "huggingface" / "hub";
  if (const char* home = env("HOME")) return fs::path(home) / ".cache" / "huggingface" / "hub";
  return std::nullopt;
}

// "org/name" as the Hub spells repo ids: no leading dot or dash, one slash.
bool is_repo_id(const std::string& s) {
  static const std::regex id(R"([A-Za-z0-9_][A-Za-z0-9_.-]*/[A-Za-z0-9_][A-Za-z0-9_.-]*)");
  return std::regex_match(s, id) && s.find("..") == std::string::npos;
}

std::optional<fs::path> cached_snapshot(const std::string& repo) {
  const std::optional<fs::path> cache = hub_cache();
  if (!cache) return std::nullopt;
  std::string folder = "models--" + repo;
  folder.replace(folder.find('/'), 1, "--");
  const fs::path root = *cache / folder;
  std::error_code ec;
  std::string rev;
  if (std::ifstream ref(root / "refs" / "main"); ref >> rev) {
    const fs::path snapshot = root / "snapshots" / rev;
    if (fs::is_directory(snapshot, ec)) return snapshot;
  }
  std::vector<fs::path> snapshots;
  for (fs::directory_iterator it(root / "snapshots", ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory(ec)) snapshots.push_back(it->path());
  }
  if (snapshots.size() == 1) return snapshots.front();
  return std::nullopt;
}

void resolve_key(nlohmann::json& cfg, const std::string& key) {
  std::string pointer = "/" + key;
  for (char& c : pointer) c = c == '.' ? '/' : c;
  const nlohmann::json::json_pointer at(pointer);
  if (!cfg.contains(at) || !cfg[at].is_string()) return;
  std::string value = expand_user(cfg[at].get<std::string>());
  std::error_code ec;
  if (!fs::exists(value, ec) && is_repo_id(value)) {
    if (std::optional<fs::path> snapshot = cached_snapshot(value)) value = snapshot->string();
  }
  cfg[at] = value;
}

}  // namespace

std::string expand_user(std::string path) {
  if ((path == "~" || path.rfind("~/", 0) == 0) && env("HOME") != nullptr) path = std::string(env("HOME")) + path.substr(1);
  return path;
}

void resolve_model_paths(nlohmann::json& cfg, ConfigKind kind) {
  static const std::vector<std::string> ppo = {"actor_rollout_ref.model.path",      "critic.model.path",
                                               "critic.model.tokenizer_path",       "reward_model.model.path",
                                               "reward_model.model.input_tokenizer", "data.tokenizer"};
  static const std::vector<std::string> sft = {"model.partial_pretrain"};
  for (const auto& key : kind == ConfigKind::ppo ? ppo : sft) resolve_key(cfg, key);
}

}  // namespace tessera::driver
