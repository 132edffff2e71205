// modes.hpp: verl's Dispatch and Execute modes as a registry of (split, collect) functions.
//
// A call `wg.method(args...)` is: split(args) -> one Args per rank (plus a pad count), run the
// ranks chosen by the Execute mode, then collect(outputs) -> one Value (unpadded). These are
// pure functions over Values; the WorkerGroup (dispatch/worker_group.hpp) does the calling.
//
// Built-in modes (names are verl's, see the Dispatch namespace below):
//   ONE_TO_ALL                  every rank gets every arg; collect: list of N outputs.
//   ALL_TO_ALL                  args as they are (if EVERY arg is a list of length N, rank i gets
//                               element i, as verl's execute_all does); collect: list of outputs.
//   DP_COMPUTE                  every arg is a list of length N; rank i gets element i.
//   DP_COMPUTE_PROTO            every arg is a DataProto (or future), chunked N ways with
//                               auto-padding; collect: concat, then unpad.
//   DP_COMPUTE_PROTO_WITH_FUNC  args[0] is a function name (JSON string) given to all ranks; the
//                               other args are chunked (no padding); collect: concat.
//   DP_COMPUTE_METRIC           split like DP_COMPUTE_PROTO; collect: the list of N outputs.
//   nd:<mesh>                   n-d dispatch, made by make_nd_compute_dataproto_dispatch(mesh):
//                               rank r gets chunk dp_rank[r]; only collect ranks answer.
// Note [Auto-padding] in modes.cpp records how padding follows verl and where it differs.
//
// Thread-safety: DispatchRegistry is internally synchronised; modes are returned by value.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dispatch/value.hpp"
#include "proto/status.hpp"

namespace tessera::dispatch {

/// verl's Dispatch enum, as the registry's names.
namespace Dispatch {
inline constexpr const char* ONE_TO_ALL = "ONE_TO_ALL";
inline constexpr const char* ALL_TO_ALL = "ALL_TO_ALL";
inline constexpr const char* DP_COMPUTE = "DP_COMPUTE";
inline constexpr const char* DP_COMPUTE_PROTO = "DP_COMPUTE_PROTO";
inline constexpr const char* DP_COMPUTE_PROTO_WITH_FUNC = "DP_COMPUTE_PROTO_WITH_FUNC";
inline constexpr const char* DP_COMPUTE_METRIC = "DP_COMPUTE_METRIC";
}  // namespace Dispatch

/// verl's Execute enum: which ranks a call runs on.
enum class ExecuteMode : uint8_t { all = 0, rank_zero = 1 };

/// "ALL" / "RANK_ZERO".
const char* to_string(ExecuteMode mode);
/// Parses "ALL" / "RANK_ZERO" (case-insensitive). Error names the text.
Result<ExecuteMode> parse_execute_mode(const std::string& text);
/// The ranks a call runs on: all of [0, world), or just rank 0.
std::vector<int32_t> execute_ranks(ExecuteMode mode, int32_t world_size);

/// What each rank registered for one n-d mesh (verl's _register_dispatch_collect_info).
struct MeshDispatchInfo {
  std::vector<int64_t> dp_rank;  ///< dp_rank[r] = which data chunk rank r consumes.
  std::vector<bool> is_collect;  ///< is_collect[r] = whether rank r's output is gathered.
};

/// Inputs of a split function.
struct SplitContext {
  int32_t world_size = 1;
  /// Pad DataProto args even if their meta_info does not ask for it (verl's
  /// DataProtoConfig.auto_padding / VERL_AUTO_PADDING).
  bool auto_padding = false;
  /// Per-mesh rank registrations, for n-d modes (filled and cached by the WorkerGroup).
  std::map<std::string, MeshDispatchInfo> mesh_info;
};

/// Output of a split function.
struct SplitResult {
  std::vector<Args> per_rank;  ///< per_rank[r] = the args rank r receives (size == world).
  /// Rows of padding added to the DataProto args (to strip from the output). -1 when the data
  /// is a future whose length is not known yet: the WorkerGroup computes it once it is.
  int64_t pad = 0;
};

/// Inputs of a collect function.
struct CollectContext {
  int32_t world_size = 1;
  int64_t pad = 0;  ///< Rows to drop from the end of a concatenated DataProto.
  std::map<std::string, MeshDispatchInfo> mesh_info;
};

using SplitFn = std::function<Result<SplitResult>(const Args&, const SplitContext&)>;
/// Receives one output per rank in rank order (every rank of the world; for n-d modes the
/// non-collect ranks' outputs are present but ignored).
using CollectFn = std::function<Result<Value>(const ValueList&, const CollectContext&)>;

/// A named (split, collect) pair.
struct DispatchMode {
  std::string name;
  SplitFn split;
  CollectFn collect;
};

/// Rows of padding that make `length` divisible by `world_size`: (N - L % N) % N.
int64_t pad_size_for(int64_t length, int64_t world_size);

/// Chunks one DataProto argument for `world_size` ranks, padding it first with copies of its
/// last row when `pad_rows` > 0 (the caller's object is never modified).
Result<std::vector<proto::DataProto>> chunk_proto(const proto::DataProto& data, int64_t pad_rows,
                                                  int32_t world_size);

/// Concatenates DataProto outputs (not copied) and drops the last `pad` rows (a view).
Result<proto::DataProto> concat_and_unpad(const std::vector<const proto::DataProto*>& parts,
                                          int64_t pad);

/// The n-d dispatch mode for `mesh_name` (verl's make_nd_compute_dataproto_dispatch_fn), named
/// "nd:<mesh_name>". Unlike verl it auto-pads to the number of dp chunks when padding is enabled.
DispatchMode make_nd_compute_dataproto_dispatch(const std::string& mesh_name);

/// Name -> DispatchMode. Holds the built-in modes; users add their own at run time.
class DispatchRegistry {
 public:
  /// A registry holding the built-in modes.
  DispatchRegistry();

  /// The process-wide registry used by WorkerGroups.
  static DispatchRegistry& global();

  /// Adds a mode (verl's register_dispatch_mode). Error if the name exists or a function is empty.
  Status register_mode(DispatchMode mode);
  /// Replaces an existing mode (verl's update_dispatch_mode). Error if it does not exist.
  Status update_mode(DispatchMode mode);
  /// The mode called `name`; "nd:<mesh>" names are created on first use. Error lists the
  /// known names.
  Result<DispatchMode> find(const std::string& name) const;
  /// As find(), without copying the mode's functions (a reference count instead): the mode as
  /// it was when looked up, still valid after update_mode replaces it.
  Result<std::shared_ptr<const DispatchMode>> find_shared(const std::string& name) const;
  /// Whether `name` resolves (built-in, registered, or an nd: name).
  bool contains(const std::string& name) const;
  /// Registered names, sorted.
  std::vector<std::string> names() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const DispatchMode>> modes_;
};

/// Convenience: look up `mode` in `registry`, split `args`.
Result<SplitResult> split_args(const DispatchRegistry& registry, const std::string& mode,
                               const Args& args, const SplitContext& ctx);

/// Convenience: collect outputs of an ExecuteMode::all call, or pass the single output of a
/// rank_zero call through unchanged (verl applies no gathering to RANK_ZERO results).
Result<Value> collect_outputs(const DispatchRegistry& registry, const std::string& mode,
                              ExecuteMode execute, const ValueList& outputs,
                              const CollectContext& ctx);

}  // namespace tessera::dispatch
