// config.hpp: verl-style trainer configuration: YAML defaults + a user file + Hydra overrides.
//
// A config is an nlohmann::json object tree. load_config() builds it in four steps:
//   1. the defaults for the trainer kind (examples/config/ppo_trainer.yaml or sft_trainer.yaml,
//      embedded into the binary at build time, so `tessera` works from any directory);
//   2. the user's YAML file merged over them (objects merge key by key; other values replace);
//   3. Hydra overrides, in order: `a.b.c=value` (the key must exist), `+a.b=value` (the key must
//      NOT exist: it is added), `++a.b=value` (set or add), `~a.b` (delete);
//   4. interpolations resolved: `${a.b}`, `${.sibling}` / `${..uncle}` (relative) and
//      `${oc.select:a.b,default}`; a string may embed several (`ckpt/${x}/${y}`). Any other
//      resolver (`${oc.env:...}`, `${eval:...}`) is refused naming the key.
// Typing (steps 2 and 3): an unknown key is refused naming its full dotted path; a value whose
// JSON type differs from the default's (after the defaults' own interpolations are resolved)
// is refused naming the key, the expected and the given type. A float key accepts integers; a
// key whose default is null accepts anything; an empty-object default (`override_config: {}`)
// is free-form; list elements are not checked; a string where the default is a list becomes a
// one-element list (verl's str-or-list keys: trainer.logger=console). Hydra's `_target_` keys
// are accepted and dropped.
// Scalars are typed like Hydra's override grammar: integers, floats (1e-6, .5, inf, nan),
// true/false (any case), null / ~, everything else a string; quoted scalars stay strings.
//
// validate_ppo_config / validate_sft_config apply verl's driver-side rules (verl
// RayPPOTrainer._validate_config, FSDPSFTTrainer's batch checks); each error is one line naming
// the keys and values involved. Load and validate are separate so tools can load a config that a
// trainer would refuse.
//
// Thread-safety: plain functions over values; no shared state.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"

namespace tessera::driver {

/// Which trainer's defaults a config starts from.
enum class ConfigKind { ppo, sft };

/// The built-in defaults YAML text for `kind` (examples/config/*.yaml as of the build).
std::string_view default_config_yaml(ConfigKind kind);

/// Parses YAML text into JSON with the scalar typing described above. `source` (a file name)
/// prefixes errors, which carry the YAML line: "SOURCE:LINE: why".
Result<nlohmann::json> yaml_to_json(std::string_view text, const std::string& source);

/// Reads and parses a YAML file; errors name the path.
Result<nlohmann::json> read_yaml_file(const std::filesystem::path& path);

/// A command line's config file and overrides.
struct ConfigArgs {
  std::filesystem::path file;          ///< Empty: the built-in defaults are the base.
  std::vector<std::string> overrides;
};

/// Splits `tessera train|sft|config` arguments the way verl runs are written: an optional YAML
/// file first (an argument that is not an override), then Hydra overrides (`a.b=c`, `+a.b=c`,
/// `++a.b=c`, `~a.b`). Hydra's `--config-path DIR --config-name NAME` name the file instead
/// (`NAME` gets `.yaml` when it has no extension); then every argument is an override. Errors:
/// an argument after the first that is not an override, naming it.
Result<ConfigArgs> split_config_args(const std::vector<std::string>& args, const std::string& config_path = "",
                                     const std::string& config_name = "");

/// `cfg` as YAML that yaml_to_json reads back to the same JSON (strings are quoted where the
/// scalar typing would change them). `tessera config` prints it; trainers write it to
/// <trainer.default_local_dir>/config.yaml.
std::string config_to_yaml(const nlohmann::json& cfg);

/// Parses one override's value ("3", "1e-6", "[a,b]", "null", "'quoted'") with Hydra's typing.
Result<nlohmann::json> parse_override_value(std::string_view text);

/// The defaults for `kind`, with their own interpolations resolved: the type schema.
Result<nlohmann::json> config_schema(ConfigKind kind);

/// Merges `user` over `base` in place, checking every key and type against `schema` (the
/// resolved defaults). `source` names the origin in errors ("run.yaml").
/// REQUIRES: base, user and schema are JSON objects.
Status merge_config(nlohmann::json& base, const nlohmann::json& user, const nlohmann::json& schema,
                    const std::string& source);

/// Applies one Hydra override string (see the header comment) in place, type-checked against
/// `schema`. Errors name the override text and the key.
Status apply_override(nlohmann::json& cfg, std::string_view override_text, const nlohmann::json& schema);

/// Resolves every interpolation in `cfg` in place (references may chain; cycles are errors).
Status resolve_interpolations(nlohmann::json& cfg);

/// Steps 1-4 above. `user_file` may be empty (defaults only). After resolution every value is
/// type-checked against the schema once more (an interpolation may have produced a wrong type).
Result<nlohmann::json> load_config(ConfigKind kind, const std::filesystem::path& user_file,
                                   const std::vector<std::string>& overrides);

/// verl's RayPPOTrainer._validate_config rules (reference/verl-fsdp.md §3.4) plus the values
/// verl asserts elsewhere (truncation, resume_mode, adv_estimator, loss_agg_mode).
Status validate_ppo_config(const nlohmann::json& cfg);

/// verl's SFT trainer checks: train_batch_size divisible by the data-parallel size and the
/// per-rank batch divisible by micro_batch_size_per_gpu; truncation and resume_mode values.
Status validate_sft_config(const nlohmann::json& cfg);

/// True when `algorithm.adv_estimator` needs a critic (verl: only `gae`).
bool need_critic(const nlohmann::json& cfg);
/// True when a reference policy is needed (`use_kl_in_reward` or `actor.use_kl_loss`).
bool need_reference_policy(const nlohmann::json& cfg);

// ---- Typed access ------------------------------------------------------------------------------

/// The value at dotted path `key` ("trainer.total_epochs"); nullptr when absent.
const nlohmann::json* config_find(const nlohmann::json& cfg, std::string_view key);

/// The value at `key` converted to T (int64_t, double, bool, std::string, std::vector<...>,
/// nlohmann::json, or std::optional<...> of those, where null gives nullopt). Errors:
/// not_found "config key 'a.b' is missing", invalid_argument "config key 'a.b' = V is not <type>".
template <class T>
Result<T> config_get(const nlohmann::json& cfg, std::string_view key);

/// Like config_get, but an absent key gives `fallback` (verl's `config.get(key, default)`).
template <class T>
Result<T> config_get_or(const nlohmann::json& cfg, std::string_view key, T fallback);

namespace detail {
template <class T> struct is_optional : std::false_type {};
template <class T> struct is_optional<std::optional<T>> : std::true_type { using type = T; };
/// True when `v` is acceptable as a T (int64_t rejects floats and bools, double accepts ints).
template <class T> bool json_is(const nlohmann::json& v);
std::string json_brief(const nlohmann::json& v);
const char* type_name_int();
const char* type_name_double();
const char* type_name_bool();
const char* type_name_string();

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, int64_t>) return type_name_int();
  else if constexpr (std::is_same_v<T, double>) return type_name_double();
  else if constexpr (std::is_same_v<T, bool>) return type_name_bool();
  else if constexpr (std::is_same_v<T, std::string>) return type_name_string();
  else return "the expected type";
}

template <class T>
bool json_is(const nlohmann::json& v) {
  if constexpr (std::is_same_v<T, int64_t>) return v.is_number_integer();
  else if constexpr (std::is_same_v<T, double>) return v.is_number();
  else if constexpr (std::is_same_v<T, bool>) return v.is_boolean();
  else if constexpr (std::is_same_v<T, std::string>) return v.is_string();
  else if constexpr (std::is_same_v<T, nlohmann::json>) return true;
  else return v.is_array();  // std::vector<...>: elements checked by get<>
}
}  // namespace detail

template <class T>
Result<T> config_get(const nlohmann::json& cfg, std::string_view key) {
  const nlohmann::json* v = config_find(cfg, key);
  if (v == nullptr) return make_error(ErrorCode::not_found, "config key '{}' is missing", key);
  if constexpr (detail::is_optional<T>::value) {
    if (v->is_null()) return T{};
    using U = typename detail::is_optional<T>::type;
    auto r = config_get<U>(cfg, key);
    if (!r.ok()) return r.status();
    return T{std::move(r).value()};
  } else {
    if (!detail::json_is<T>(*v)) {
      return make_error(ErrorCode::invalid_argument, "config key '{}' = {} is not {}", key,
                        detail::json_brief(*v), detail::type_name<T>());
    }
    try {
      return v->get<T>();
    } catch (const std::exception& e) {
      return make_error(ErrorCode::invalid_argument, "config key '{}' = {}: {}", key, detail::json_brief(*v),
                        e.what());
    }
  }
}

template <class T>
Result<T> config_get_or(const nlohmann::json& cfg, std::string_view key, T fallback) {
  if (config_find(cfg, key) == nullptr) return fallback;
  return config_get<T>(cfg, key);
}

}  // namespace tessera::driver
