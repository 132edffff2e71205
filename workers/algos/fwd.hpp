// fwd.hpp: forward declarations for tessera::algos (verl's core_algos in LibTorch).
#pragma once

namespace tessera::algos {

struct AdvantageConfig;
struct AdvantageInputs;
struct AdvantageReturn;
struct KLControlConfig;
class KLController;
class AdaptiveKLController;
class FixedKLController;
struct PolicyLossConfig;
struct PolicyLossOutput;
struct ValueLossOutput;

}  // namespace tessera::algos
