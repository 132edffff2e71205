// fwd.hpp: forward declarations of tessera::proto's public types, for headers that only pass
// them by reference or pointer (CAF-style; keeps LibTorch and JSON out of such headers).
#pragma once

namespace tessera {
class Status;
template <class T>
class Result;
}  // namespace tessera

namespace tessera::proto {

class Buffer;
class Column;
class DataProto;
class DataProtoIterator;
class EncodedFrame;
struct DataProtoItem;
struct DecodeOptions;
struct EncodeOptions;
struct FrameInfo;
struct FromDictOptions;
struct Slice;
template <class V>
class OrderedDict;

}  // namespace tessera::proto
