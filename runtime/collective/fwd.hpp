// fwd.hpp: forward declarations of tessera::collective's public types.
#pragma once

namespace tessera::collective {
class Communicator;
class DeviceMesh;
struct CollectiveOptions;
struct CommunicatorOptions;
enum class ReduceOp : unsigned char;
}  // namespace tessera::collective
