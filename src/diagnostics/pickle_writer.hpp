// diagnostics/pickle_writer.hpp — a streaming writer of Python pickles (protocol 4) for plain
// data: dict, list, tuple, str, int (up to 2^64-1), float, bool, None, bytes.
//
// It emits only opcodes that both Python's unpickler and the small JavaScript unpickler of
// PyTorch's memory viewer (torch/utils/viz/MemoryViz.js) understand: PROTO, FRAME, EMPTY_DICT,
// EMPTY_LIST, EMPTY_TUPLE, MARK, SETITEMS, APPENDS, TUPLE, TUPLE1-3, BININT, BININT1, BININT2,
// LONG1, BINFLOAT, SHORT_BINUNICODE, BINUNICODE, NONE, NEWTRUE, NEWFALSE, MEMOIZE, BINGET,
// LONG_BINGET and STOP (bytes, which the viewer never sees, use SHORT_BINBYTES/BINBYTES).
// Strings are memoized, as Python's pickler does, so repeated keys and frame names cost a
// BINGET each. Invalid UTF-8 is replaced by U+FFFD (Python would refuse to load it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "diagnostics/py_value.hpp"

namespace stitch::detail {

/// `s` with every invalid UTF-8 sequence replaced by U+FFFD (unchanged if it is valid).
std::string sanitize_utf8(std::string_view s);
/// True if `s` is valid UTF-8 (no surrogates, no overlong forms).
bool valid_utf8(std::string_view s) noexcept;

class PickleWriter {
 public:
  PickleWriter();

  // A value is written with one scalar call or a begin_*/end_* pair; inside a dict, calls
  // alternate key, value, key, value... (a key is any hashable value; key() writes a str).
  void begin_dict();
  void end_dict();
  void begin_list();
  void end_list();
  void begin_tuple();
  void end_tuple();
  void key(std::string_view k) { string(k); }
  void none();
  void boolean(bool v);
  void integer(std::int64_t v);
  void uinteger(std::uint64_t v);
  /// An int beyond 64 bits (PyValue::is_wide), as LONG1 or LONG4.
  void wide_integer(const PyValue& v);
  void floating(double v);
  void string(std::string_view v);
  void bytes(std::string_view v);
  /// Writes a whole PyValue. Lists and dicts the reader found shared (referenced more than once
  /// in the pickle it came from) are written once and referenced after that, as Python would.
  void value(const PyValue& v);

  /// Sharing of a sub-value that occurs many times (e.g. one stack frame in many traces): if a
  /// value was recorded under `id`, writes a reference to it and returns true. Otherwise returns
  /// false and the next dict or list begun is recorded under `id`.
  bool reuse(std::string_view id);

  /// Ends the pickle (STOP) and returns its bytes. Throws stitch::error if a container is open
  /// or no value was written.
  std::string finish();

 private:
  enum class Kind : std::uint8_t { list, dict, tuple };
  struct Level {
    Kind kind;
    std::uint32_t batch = 0;  ///< items since the last MARK (lists, dicts)
    bool want_value = false;  ///< dict: a key was written, its value comes next
  };

  void op(std::uint8_t code);
  void raw(const void* p, std::size_t n);
  void begin_item();
  void end_item();
  void get(std::uint32_t index);
  void memoize_pending();
  bool shared_node(const PyValue& v);
  void open_frame();
  void close_frame();

  std::string out_;
  std::size_t frame_header_ = 0;
  std::vector<Level> levels_;
  bool started_ = false;
  bool done_ = false;
  std::uint32_t memo_count_ = 0;
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  using Memo = std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>>;
  Memo strings_;
  Memo shared_;
  std::unordered_map<const void*, std::uint32_t> nodes_;  ///< shared PyValue containers written
  std::string pending_share_;
  bool has_pending_share_ = false;
  const void* pending_node_ = nullptr;
};

}  // namespace stitch::detail
