# wire.capnp: the Cap'n Proto header of a DataProto frame (Note [Wire format] in codec_encode.cpp).
# Only proto/ includes the generated proto/wire.capnp.h; everything else uses proto/codec.hpp.
# Evolve by adding fields with new ordinals; never renumber. Bump the prefix version for
# incompatible layout changes.
@0xd14764cc4c9fefd8;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tessera::proto::wire");

# Tensor element types. Decoders reject ordinals they do not know.
enum DType {
  f32 @0;
  f64 @1;
  f16 @2;
  bf16 @3;
  i64 @4;
  i32 @5;
  i16 @6;
  i8 @7;
  u8 @8;
  bool @9;
}

# One contiguous run of a tensor's bytes, relative to the frame's data region (64-aligned).
struct Piece {
  offset @0 :UInt64;
  length @1 :UInt64;
}

# One batch tensor: C-contiguous bytes = concatenation of its pieces, in order.
struct TensorEntry {
  name @0 :Text;
  dtype @1 :DType;
  shape @2 :List(Int64);
  pieces @3 :List(Piece);
}

# One non-tensor column: rows * width values, row-major.
struct ColumnEntry {
  name @0 :Text;
  rows @1 :Int64;
  width @2 :Int64;
  values :union {
    strings @3 :List(Data);   # arbitrary bytes
    int64s @4 :List(Int64);
    float64s @5 :List(Float64);
    jsons @6 :List(Text);     # one JSON document per value
  }
}

struct Header {
  numRows @0 :Int64;
  tensors @1 :List(TensorEntry);
  columns @2 :List(ColumnEntry);
  metaJson @3 :Text;          # meta_info as a JSON object
}
