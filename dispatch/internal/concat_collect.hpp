// concat_collect.hpp: when a mode's collect is the built-in concatenation (dispatch only).
//
// Note [Replies joined in place]: the built-in DP_COMPUTE_PROTO collects concatenate the ranks'
// DataProtos (then strip the padding). When every reply is an in-process DataProto (a
// proto_local WireValue without a row range: runtime/wire.hpp), the WorkerGroup concatenates
// the replies where they lie instead of decoding each into a Value first: concat only reads its
// pieces, so the result is the same DataProto (tensors by reference either way), minus a
// DataProto move, a Value and a decode per rank on the caller's serial path (~4k instructions
// per 8-rank call). A mode whose collect was replaced (update_mode), or any other collect, runs
// as registered.
#pragma once

#include <cstdint>
#include <optional>

#include "dispatch/modes.hpp"

namespace tessera::dispatch::internal {

/// The padding to strip when `mode`'s collect is a built-in concatenation (DP_COMPUTE_PROTO's:
/// ctx.pad; DP_COMPUTE_PROTO_WITH_FUNC's: 0), or nullopt for any other collect.
std::optional<int64_t> concat_collect_pad(const DispatchMode& mode, const CollectContext& ctx);

}  // namespace tessera::dispatch::internal
