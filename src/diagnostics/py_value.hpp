// diagnostics/py_value.hpp — PyValue: a Python value of plain data (None, bool, int, float, str,
// bytes, list, tuple, dict), as the snapshot writers build it and the pickle reader of the tools
// (tools/formats/pickle_reader.hpp) returns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stitch::detail {

/// A Python value of a plain-data pickle. Copies share containers and strings, like Python
/// references; the depth of nesting is bounded (PyValue::kMaxDepth) so that destruction and every
/// traversal stay shallow.
class PyValue {
 public:
  enum class Type : std::uint8_t { none, boolean, integer, floating, string, bytes, list, tuple, dict };
  using Items = std::vector<PyValue>;
  using Entries = std::vector<std::pair<PyValue, PyValue>>;
  /// Deepest nesting the builders accept.
  static constexpr std::uint32_t kMaxDepth = 1000;

  PyValue() noexcept : u_(0) {}  ///< None

  static PyValue boolean(bool v);
  static PyValue integer(std::int64_t v);
  /// An int from an unsigned 64-bit value (stored as a plain int when it fits in int64).
  static PyValue unsigned_integer(std::uint64_t v);
  /// An int of any size from its two's-complement bytes, least significant first (the payload
  /// of pickle's LONG1/LONG4; "" is 0). Kept as a 64-bit int where it fits.
  static PyValue long_integer(std::string_view le_bytes);
  static PyValue floating(double v);
  static PyValue string(std::string v);
  static PyValue bytes(std::string v);
  static PyValue list(Items items = {});
  static PyValue tuple(Items items = {});
  static PyValue dict(Entries entries = {});

  [[nodiscard]] Type type() const noexcept { return type_; }
  /// Python's name of the type ("NoneType", "bool", "int", "float", "str", "bytes", ...).
  [[nodiscard]] const char* type_name() const noexcept;
  [[nodiscard]] bool is_none() const noexcept { return type_ == Type::none; }
  [[nodiscard]] bool is_bool() const noexcept { return type_ == Type::boolean; }
  [[nodiscard]] bool is_int() const noexcept { return type_ == Type::integer; }
  [[nodiscard]] bool is_float() const noexcept { return type_ == Type::floating; }
  [[nodiscard]] bool is_string() const noexcept { return type_ == Type::string; }
  [[nodiscard]] bool is_list() const noexcept { return type_ == Type::list; }
  [[nodiscard]] bool is_tuple() const noexcept { return type_ == Type::tuple; }
  [[nodiscard]] bool is_dict() const noexcept { return type_ == Type::dict; }
  /// An int above INT64_MAX (only as_uint() can return it).
  [[nodiscard]] bool is_big() const noexcept { return type_ == Type::integer && big_; }
  /// An int that fits in neither int64 nor uint64 (PyTorch writes such ints in metadata, e.g. an
  /// unknown line as 2^64 - 1 is fine, but other producers go wider). as_int() and as_uint()
  /// throw for it; decimal() and long_bytes() give it whole.
  [[nodiscard]] bool is_wide() const noexcept { return type_ == Type::integer && wide_; }
  /// Any int as Python prints it.
  [[nodiscard]] std::string decimal() const;
  /// Any int's lowest 64 bits (two's complement).
  [[nodiscard]] std::uint64_t low_bits() const noexcept { return u_; }
  /// A wide int's minimal two's-complement bytes, least significant first.
  [[nodiscard]] const std::string& long_bytes() const;

  // Accessors throw stitch::error naming the expected and the actual type.
  [[nodiscard]] bool as_bool() const;
  [[nodiscard]] std::int64_t as_int() const;    ///< int in int64 range
  [[nodiscard]] std::uint64_t as_uint() const;  ///< non-negative int up to 2^64-1
  [[nodiscard]] double as_float() const;        ///< float, or int converted
  [[nodiscard]] const std::string& as_string() const;
  [[nodiscard]] const std::string& as_bytes() const;
  [[nodiscard]] const Items& items() const;      ///< list or tuple
  [[nodiscard]] const Entries& entries() const;  ///< dict, in insertion order
  /// list/tuple/dict length, string/bytes length; 0 otherwise.
  [[nodiscard]] std::size_t size() const noexcept;
  /// The value of dict key `key` (a str); nullptr if absent or if this is not a dict. A key
  /// stored twice yields its last value, as in Python.
  [[nodiscard]] const PyValue* get(std::string_view key) const noexcept;

  /// Appends to a list. Throws if this is not a list or if `v` contains this list (a cycle).
  void append(PyValue v);
  /// Adds a dict entry. Throws if this is not a dict, the key is unhashable (list, dict) or `v`
  /// contains this dict.
  void set(PyValue key, PyValue v);

  /// Deep equality (1 == 1.0 is false: types must match; NaN != NaN).
  bool operator==(const PyValue& b) const;

  /// A short Python-like rendering, cut after `max_chars` characters (for messages and tests).
  [[nodiscard]] std::string repr(std::size_t max_chars = 200) const;

  // ---- for the reader ------------------------------------------------------------------------
  struct Node {
    std::string text;          ///< str / bytes payload
    Items items;               ///< list / tuple
    Entries entries;           ///< dict
    std::uint32_t height = 0;  ///< 1 + the deepest child (containers)
    bool shared = false;       ///< referenced more than once: frozen
  };
  [[nodiscard]] Node* node() const noexcept { return node_.get(); }
  [[nodiscard]] std::uint32_t height() const noexcept { return node_ && is_container() ? node_->height : 0; }
  [[nodiscard]] bool is_container() const noexcept {
    return type_ == Type::list || type_ == Type::tuple || type_ == Type::dict;
  }
  [[nodiscard]] bool hashable() const noexcept;

 private:
  Type type_ = Type::none;
  bool big_ = false;
  bool wide_ = false;  ///< beyond 64 bits: node_->text holds its bytes, u_ its low 64 bits
  union {
    bool b_;
    std::uint64_t u_;  ///< every int (two's complement; big_ marks values above INT64_MAX)
    double f_;
  };
  std::shared_ptr<Node> node_;
};

/// Writes `v` through `w` (a PickleWriter or the JSON writer: none, boolean, integer, uinteger,
/// wide_integer, floating, string, bytes) when it is a scalar; false, writing nothing, for a
/// container.
template <typename Writer>
bool write_scalar(Writer& w, const PyValue& v) {
  switch (v.type()) {
    case PyValue::Type::none: w.none(); return true;
    case PyValue::Type::boolean: w.boolean(v.as_bool()); return true;
    case PyValue::Type::integer:
      if (v.is_wide()) w.wide_integer(v);
      else if (v.is_big()) w.uinteger(v.as_uint());
      else w.integer(v.as_int());
      return true;
    case PyValue::Type::floating: w.floating(v.as_float()); return true;
    case PyValue::Type::string: w.string(v.as_string()); return true;
    case PyValue::Type::bytes: w.bytes(v.as_bytes()); return true;
    default: return false;
  }
}

}  // namespace stitch::detail
