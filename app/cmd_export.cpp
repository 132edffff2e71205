// `tessera export CKPT_DIR OUT_DIR`: writes a HF model directory (config.json, safetensors,
// tokenizer files) from a sharded FSDP checkpoint saved at any world size (verl's model_merger,
// without needing the original world size or any process group).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

#include "app/commands.hpp"
#include "workers/fsdp/checkpoint.hpp"

namespace tessera::app {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                           "special_tokens_map.json", "generation_config.json"};

// Copies the tokenizer files found in `from` (if any) into `to`; returns how many were copied.
Result<int> copy_tokenizer_files(const fs::path& from, const fs::path& to) {
  int copied = 0;
  for (const char* name : kTokenizerFiles) {
    std::error_code ec;
    if (!fs::exists(from / name, ec)) continue;
    fs::copy_file(from / name, to / name, fs::copy_options::overwrite_existing, ec);
    if (ec)
      return make_error(ErrorCode::io_error, "cannot copy {} to {}: {}", (from / name).string(), to.string(),
                        ec.message());
    ++copied;
  }
  return copied;
}

Status run_export(const std::string& ckpt, const std::string& out, const std::string& dtype,
                  const std::string& tokenizer_dir) {
  fsdp::ExportOptions options;
  if (dtype == "bf16" || dtype == "bfloat16") options.dtype = c10::ScalarType::BFloat16;
  else if (dtype == "fp32" || dtype == "float32") options.dtype = c10::ScalarType::Float;
  else if (dtype == "fp16" || dtype == "float16") options.dtype = c10::ScalarType::Half;
  else if (!dtype.empty())
    return make_error(ErrorCode::invalid_argument, "--dtype '{}': expected fp32, bf16 or fp16", dtype);
  // Stage into a sibling directory and rename, so OUT_DIR never holds a half-written model.
  const fs::path staging = fs::path(out).string() + ".tmp-export";
  std::error_code ec;
  fs::remove_all(staging, ec);
  if (fs::exists(out, ec) && !fs::is_empty(out, ec))
    return make_error(ErrorCode::already_exists, "output directory '{}' exists and is not empty", out);
  TESSERA_RETURN_IF_ERROR(fsdp::export_hf(ckpt, staging.string(), options));
  const fs::path source = tokenizer_dir.empty() ? fs::path(ckpt) / "huggingface" : fs::path(tokenizer_dir);
  TESSERA_ASSIGN_OR_RETURN(int copied, copy_tokenizer_files(source, staging));
  if (copied == 0 && !tokenizer_dir.empty())
    return make_error(ErrorCode::not_found, "--tokenizer '{}' holds no tokenizer.json", tokenizer_dir);
  fs::remove(out, ec);  // an empty directory may stand in the way of the rename
  fs::rename(staging, out, ec);
  if (ec) return make_error(ErrorCode::io_error, "cannot rename {} to {}: {}", staging.string(), out, ec.message());
  if (copied == 0)
    std::fprintf(stderr, "tessera export: no tokenizer files in %s; pass --tokenizer DIR to include them\n",
                 source.string().c_str());
  return Status();
}

}  // namespace

void add_export_commands(CLI::App& app) {
  auto* cmd = app.add_subcommand("export", "Write a HF model directory from a sharded checkpoint (any world size)");
  static std::string ckpt, out, dtype, tokenizer;
  cmd->add_option("CKPT_DIR", ckpt, "checkpoint directory (global_step_N/actor or a sharded save)")->required();
  cmd->add_option("OUT_DIR", out, "output HF directory (must not exist or be empty)")->required();
  cmd->add_option("--dtype", dtype, "cast weights: fp32 | bf16 | fp16 (default: as stored)");
  cmd->add_option("--tokenizer", tokenizer, "copy tokenizer files from DIR (default: CKPT_DIR/huggingface)");
  cmd->callback([] {
    Status st = run_export(ckpt, out, dtype, tokenizer);
    if (!st.ok()) {
      std::fprintf(stderr, "tessera export: %s\n", st.to_string().c_str());
      exit_code() = 1;
      return;
    }
    std::printf("exported %s -> %s\n", ckpt.c_str(), out.c_str());
  });
}

}  // namespace tessera::app
