// checkpoint_io.cpp: file-level helpers of the sharded checkpoint (internal/checkpoint_io.hpp).
#include "workers/fsdp/internal/checkpoint_io.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tessera::fsdp::internal {

namespace fs = std::filesystem;

std::string model_file(int k, int n) { return fmt::format("model_shard_{}_of_{}.safetensors", k, n); }
std::string optim_file(int k, int n) { return fmt::format("optim_shard_{}_of_{}.safetensors", k, n); }
std::string extra_file(int r, int w) {
  return fmt::format("extra_state_rank_{}_of_{}.safetensors", r, w);
}

namespace {

Status fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return make_error(ErrorCode::io_error, "open '{}': {}", path, std::strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return make_error(ErrorCode::io_error, "fsync '{}': {}", path, std::strerror(errno));
  return Status();
}

std::string parent_of(const std::string& path) {
  std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

}  // namespace

Status write_text_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".part";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return make_error(ErrorCode::io_error, "cannot write '{}': {}", tmp, std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(::fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return make_error(ErrorCode::io_error, "cannot write '{}': {}", path, std::strerror(errno));
  }
  return Status();
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::not_found, "cannot read '{}'", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Status fresh_directory(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return make_error(ErrorCode::io_error, "cannot remove '{}': {}", path, ec.message());
  fs::create_directories(path, ec);
  if (ec) return make_error(ErrorCode::io_error, "cannot create '{}': {}", path, ec.message());
  return Status();
}

Status swap_into_place(const std::string& tmp, const std::string& dir) {
  TESSERA_RETURN_IF_ERROR(fsync_path(tmp));
  std::error_code ec;
  if (!fs::exists(dir)) {
    if (std::rename(tmp.c_str(), dir.c_str()) != 0) {
      return make_error(ErrorCode::io_error, "rename '{}' -> '{}': {}", tmp, dir, std::strerror(errno));
    }
    return fsync_path(parent_of(dir));
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    TESSERA_RETURN_IF_ERROR(fsync_path(parent_of(dir)));
    fs::remove_all(tmp, ec);  // now holds the previous checkpoint
    return Status();
  }
  // The filesystem cannot exchange: two renames, with "<dir>.old" readable in between
  // (resolve_checkpoint_dir).
  std::string old = dir + ".old";
  fs::remove_all(old, ec);
  if (std::rename(dir.c_str(), old.c_str()) != 0 || std::rename(tmp.c_str(), dir.c_str()) != 0) {
    return make_error(ErrorCode::io_error, "replace '{}' with '{}': {}", dir, tmp, std::strerror(errno));
  }
  TESSERA_RETURN_IF_ERROR(fsync_path(parent_of(dir)));
  fs::remove_all(old, ec);
  return Status();
}

std::string resolve_checkpoint_dir(const std::string& dir) {
  if (!fs::exists(dir + "/manifest.json") && fs::exists(dir + ".old/manifest.json")) return dir + ".old";
  return dir;
}

Result<nlohmann::json> read_and_check_manifest(const std::string& requested) {
  std::string dir = resolve_checkpoint_dir(requested);
  std::string path = dir + "/manifest.json";
  if (!fs::exists(path)) {
    return make_error(ErrorCode::not_found, "'{}' is not a checkpoint (no manifest.json)", requested);
  }
  TESSERA_ASSIGN_OR_RETURN(std::string text, read_text(path));
  nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) return make_error(ErrorCode::corrupt_data, "{}: not a JSON object", path);
  if (m.value("format", "") != kManifestFormat || m.value("version", 0) != kManifestVersion) {
    return make_error(ErrorCode::corrupt_data, "{}: format/version is not {} v{}", path, kManifestFormat,
                      kManifestVersion);
  }
  for (const char* key : {"world_size", "shard_count", "optimizer_steps", "lr_scheduler", "units", "files"}) {
    if (!m.contains(key)) return make_error(ErrorCode::corrupt_data, "{}: missing field '{}'", path, key);
  }
  if (!m["shard_count"].is_number_integer() || m["shard_count"].get<int>() < 1 ||
      !m["world_size"].is_number_integer() || m["world_size"].get<int>() < 1 || !m["files"].is_object() ||
      !m["lr_scheduler"].contains("last_step") || !m["optimizer_steps"].is_number_integer()) {
    return make_error(ErrorCode::corrupt_data, "{}: malformed world_size/shard_count/files/lr_scheduler", path);
  }
  for (const auto& [name, size] : m["files"].items()) {
    std::error_code ec;
    auto actual = fs::file_size(dir + "/" + name, ec);
    if (ec || !size.is_number_integer() || static_cast<int64_t>(actual) != size.get<int64_t>()) {
      return make_error(ErrorCode::corrupt_data, "{}: file '{}' is missing or not {} bytes", dir, name,
                        size.dump());
    }
  }
  return m;
}

Result<bool> manifest_has_optimizer_state(const nlohmann::json& m, const std::string& dir) {
  if (!m.contains("optimizer_state")) return true;
  if (!m["optimizer_state"].is_boolean()) {
    return make_error(ErrorCode::corrupt_data, "{}/manifest.json: optimizer_state is not a boolean", dir);
  }
  return m["optimizer_state"].get<bool>();
}

Result<std::vector<FlatLayout>> manifest_layouts(const nlohmann::json& m, const std::string& dir) {
  std::vector<FlatLayout> layouts;
  if (!m["units"].is_array()) return make_error(ErrorCode::corrupt_data, "{}/manifest.json: units is not a list", dir);
  for (const auto& u : m["units"]) {
    TESSERA_ASSIGN_OR_RETURN(FlatLayout l, flat_layout_from_json(u, dir + "/manifest.json"));
    if (l.shard_count != m["shard_count"].get<int>()) {
      return make_error(ErrorCode::corrupt_data, "{}/manifest.json: unit '{}' has shard_count {} != {}",
                        dir, l.unit, l.shard_count, m["shard_count"].get<int>());
    }
    layouts.push_back(std::move(l));
  }
  return layouts;
}

Status check_same_units(const std::vector<FlatLayout>& saved, const std::vector<FlatLayout>& now,
                        const std::string& dir) {
  if (saved.size() != now.size()) {
    return make_error(ErrorCode::invalid_argument, "checkpoint '{}' has {} units, the model {}", dir,
                      saved.size(), now.size());
  }
  for (size_t u = 0; u < saved.size(); ++u) {
    const auto& a = saved[u];
    const auto& b = now[u];
    if (a.unit != b.unit || a.params.size() != b.params.size()) {
      return make_error(ErrorCode::invalid_argument, "checkpoint '{}' unit {} is '{}' ({} params), the model's '{}' ({})",
                        dir, u, a.unit, a.params.size(), b.unit, b.params.size());
    }
    for (size_t i = 0; i < a.params.size(); ++i) {
      if (a.params[i].name != b.params[i].name || a.params[i].shape != b.params[i].shape) {
        return make_error(ErrorCode::invalid_argument,
                          "checkpoint '{}' parameter '{}' [{}] does not match the model's '{}' [{}]", dir,
                          a.params[i].name, fmt::join(a.params[i].shape, ","), b.params[i].name,
                          fmt::join(b.params[i].shape, ","));
      }
    }
  }
  return Status();
}

ShardFiles::ShardFiles(std::string dir, int shard_count)
    : dir_(resolve_checkpoint_dir(dir)), shard_count_(shard_count) {}

Result<const models::TensorMap*> ShardFiles::open(const std::string& kind, int shard) {
  std::string name = kind == "model" ? model_file(shard, shard_count_) : optim_file(shard, shard_count_);
  auto it = files_.find(name);
  if (it == files_.end()) {
    TESSERA_ASSIGN_OR_RETURN(auto contents, models::read_safetensors(dir_ + "/" + name));
    it = files_.emplace(name, std::move(contents)).first;
  }
  return &it->second.tensors;
}

Result<at::Tensor> ShardFiles::recut(const FlatLayout& layout, int64_t begin, int64_t end,
                                     const std::string& kind, const std::string& tensor,
                                     std::optional<c10::ScalarType> dtype) {
  at::Tensor out;
  for (const ShardPiece& p : pieces_for_range(layout, begin, end)) {
    TESSERA_ASSIGN_OR_RETURN(const models::TensorMap* file, open(kind, p.shard));
    auto it = file->find(tensor);
    std::string fname = kind == "model" ? model_file(p.shard, shard_count_) : optim_file(p.shard, shard_count_);
    if (it == file->end() || it->second.dim() != 1 || it->second.numel() != layout.shard_numel()) {
      return make_error(ErrorCode::corrupt_data, "{}/{}: tensor '{}' is missing or not [{}]", dir_, fname,
                        tensor, layout.shard_numel());
    }
    if (!out.defined()) {
      out = at::zeros({end - begin}, at::TensorOptions(dtype.value_or(it->second.scalar_type())));
    }
    out.narrow(0, p.dest_offset, p.length).copy_(it->second.narrow(0, p.shard_offset, p.length));
  }
  if (!out.defined()) out = at::zeros({end - begin}, at::TensorOptions(dtype.value_or(at::kFloat)));
  return out;
}

Status restore_rng(const std::string& dir, int rank, int saved_world) {
  std::string path = resolve_checkpoint_dir(dir) + "/" + extra_file(rank % saved_world, saved_world);
  TESSERA_ASSIGN_OR_RETURN(auto contents, models::read_safetensors(path));
  auto it = contents.tensors.find("rng_state");
  if (it == contents.tensors.end()) return make_error(ErrorCode::corrupt_data, "{}: no 'rng_state'", path);
  try {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(it->second.clone());
  } catch (const std::exception& e) {
    return make_error(ErrorCode::corrupt_data, "{}: bad rng_state", path);
  }
  return Status();
}

std::string hf_dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::Double: return "float64";
    default: return "float32";
  }
}

}  // namespace tessera::fsdp::internal
