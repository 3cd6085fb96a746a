// diagnostics/py_value.cpp — PyValue: construction, typed access, equality and repr.
#include "diagnostics/py_value.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "stitch/errors.hpp"

namespace stitch::detail {

// ---- PyValue ------------------------------------------------------------------------------------

namespace {

std::shared_ptr<PyValue::Node> new_node() { return std::make_shared<PyValue::Node>(); }

[[noreturn]] void wrong_type(const char* expected, const PyValue& v) {
  throw error(fmt::format("expected {}, got {}", expected, v.type_name()));
}

// True if the container `target` is reachable from `v` (including v itself).
bool reaches(const PyValue& v, const PyValue::Node* target) {
  if (!v.is_container()) return false;
  if (v.node() == target) return true;
  // Everything below v is lower than v: a node at least as high cannot be inside it.
  if (target->height >= v.height()) return false;
  const PyValue::Node* n = v.node();
  for (const PyValue& c : n->items)
    if (reaches(c, target)) return true;
  for (const auto& [k, c] : n->entries)
    if (reaches(k, target) || reaches(c, target)) return true;
  return false;
}

void check_depth(std::uint32_t height) {
  if (height > PyValue::kMaxDepth)
    throw error(fmt::format("PyValue: nesting deeper than {} levels", PyValue::kMaxDepth));
}

}  // namespace

PyValue PyValue::boolean(bool v) {
  PyValue p;
  p.type_ = Type::boolean;
  p.b_ = v;
  return p;
}

PyValue PyValue::integer(std::int64_t v) {
  PyValue p;
  p.type_ = Type::integer;
  p.u_ = static_cast<std::uint64_t>(v);  // ints live in u_; as_int() converts back
  return p;
}

PyValue PyValue::unsigned_integer(std::uint64_t v) {
  PyValue p;
  p.type_ = Type::integer;
  p.u_ = v;
  p.big_ = v > static_cast<std::uint64_t>(INT64_MAX);
  return p;
}

PyValue PyValue::long_integer(std::string_view b) {
  // Minimal form: drop redundant sign-extension bytes (as Python's encode_long writes it).
  std::size_t n = b.size();
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(b[i]); };
  while (n > 1 && ((byte(n - 1) == 0x00 && (byte(n - 2) & 0x80) == 0) ||
                   (byte(n - 1) == 0xff && (byte(n - 2) & 0x80) != 0)))
    --n;
  if (n == 0) return integer(0);
  const bool negative = (byte(n - 1) & 0x80) != 0;
  std::uint64_t low = 0;
  for (std::size_t i = std::min<std::size_t>(n, 8); i > 0; --i) low = (low << 8) | byte(i - 1);
  if (n <= 8) {
    if (negative) {
      if (n < 8) low |= ~std::uint64_t{0} << (8 * n);
      return integer(static_cast<std::int64_t>(low));
    }
    return unsigned_integer(low);
  }
  if (n == 9 && byte(8) == 0x00) return unsigned_integer(low);  // 2^63 .. 2^64-1
  PyValue p;
  p.type_ = Type::integer;
  p.wide_ = true;
  p.u_ = low;
  p.node_ = new_node();
  p.node_->text.assign(b.data(), n);
  return p;
}

std::string PyValue::decimal() const {
  if (type_ != Type::integer) wrong_type("int", *this);
  if (!wide_) return big_ ? std::to_string(u_) : std::to_string(static_cast<std::int64_t>(u_));
  // The magnitude, most significant byte first, then repeated division by 10 (quadratic: past
  // Python's own limit of 4300 digits only the size is given).
  const std::string& b = node_->text;
  if (b.size() > 1786) return fmt::format("<int of {} bytes>", b.size());
  const bool negative = (static_cast<unsigned char>(b.back()) & 0x80) != 0;
  std::vector<unsigned char> mag(b.rbegin(), b.rend());
  if (negative) {  // two's complement: invert and add one
    for (unsigned char& c : mag) c = static_cast<unsigned char>(~c);
    for (std::size_t i = mag.size(); i > 0; --i)
      if (++mag[i - 1] != 0) break;
  }
  std::string digits;
  while (std::any_of(mag.begin(), mag.end(), [](unsigned char c) { return c != 0; })) {
    unsigned rem = 0;
    for (unsigned char& c : mag) {
      const unsigned cur = rem * 256 + c;
      c = static_cast<unsigned char>(cur / 10);
      rem = cur % 10;
    }
    digits += static_cast<char>('0' + rem);
  }
  if (negative) digits += '-';
  return std::string(digits.rbegin(), digits.rend());
}

const std::string& PyValue::long_bytes() const {
  if (!is_wide()) throw error("PyValue: long_bytes() of an int that fits in 64 bits");
  return node_->text;
}

PyValue PyValue::floating(double v) {
  PyValue p;
  p.type_ = Type::floating;
  p.f_ = v;
  return p;
}

PyValue PyValue::string(std::string v) {
  PyValue p;
  p.type_ = Type::string;
  p.node_ = new_node();
  p.node_->text = std::move(v);
  return p;
}

PyValue PyValue::bytes(std::string v) {
  PyValue p = string(std::move(v));
  p.type_ = Type::bytes;
  return p;
}

PyValue PyValue::list(Items items) {
  PyValue p;
  p.type_ = Type::list;
  p.node_ = new_node();
  std::uint32_t h = 0;
  for (const PyValue& c : items) h = std::max(h, c.height());
  check_depth(h + 1);
  p.node_->height = h + 1;
  p.node_->items = std::move(items);
  return p;
}

PyValue PyValue::tuple(Items items) {
  PyValue p = list(std::move(items));
  p.type_ = Type::tuple;
  return p;
}

PyValue PyValue::dict(Entries entries) {
  PyValue p;
  p.type_ = Type::dict;
  p.node_ = new_node();
  std::uint32_t h = 0;
  for (const auto& [k, v] : entries) {
    if (!k.hashable()) throw error(fmt::format("PyValue: unhashable dict key of type {}", k.type_name()));
    h = std::max({h, k.height(), v.height()});
  }
  check_depth(h + 1);
  p.node_->height = h + 1;
  p.node_->entries = std::move(entries);
  return p;
}

const char* PyValue::type_name() const noexcept {
  switch (type_) {
    case Type::none: return "NoneType";
    case Type::boolean: return "bool";
    case Type::integer: return "int";
    case Type::floating: return "float";
    case Type::string: return "str";
    case Type::bytes: return "bytes";
    case Type::list: return "list";
    case Type::tuple: return "tuple";
    case Type::dict: return "dict";
  }
  return "?";
}


bool PyValue::as_bool() const {
  if (type_ != Type::boolean) wrong_type("bool", *this);
  return b_;
}

std::int64_t PyValue::as_int() const {
  if (type_ != Type::integer) wrong_type("int", *this);
  if (wide_) throw error(fmt::format("int {} does not fit in 64 bits", decimal()));
  if (big_) throw error(fmt::format("int {} does not fit in a signed 64-bit integer", u_));
  return static_cast<std::int64_t>(u_);
}

std::uint64_t PyValue::as_uint() const {
  if (type_ != Type::integer) wrong_type("int", *this);
  if (wide_) throw error(fmt::format("int {} does not fit in 64 bits", decimal()));
  if (!big_ && static_cast<std::int64_t>(u_) < 0)
    throw error(fmt::format("expected a non-negative int, got {}", static_cast<std::int64_t>(u_)));
  return u_;
}

double PyValue::as_float() const {
  if (type_ == Type::floating) return f_;
  if (type_ == Type::integer && wide_) {
    const std::string& b = node_->text;  // sum of signed bytes times powers of 256
    double v = static_cast<double>(static_cast<signed char>(b.back()));
    for (std::size_t i = b.size() - 1; i > 0; --i) v = v * 256.0 + static_cast<unsigned char>(b[i - 1]);
    return v;
  }
  if (type_ == Type::integer) return big_ ? static_cast<double>(u_) : static_cast<double>(static_cast<std::int64_t>(u_));
  wrong_type("float", *this);
}

const std::string& PyValue::as_string() const {
  if (type_ != Type::string) wrong_type("str", *this);
  return node_->text;
}

const std::string& PyValue::as_bytes() const {
  if (type_ != Type::bytes) wrong_type("bytes", *this);
  return node_->text;
}

const PyValue::Items& PyValue::items() const {
  if (type_ != Type::list && type_ != Type::tuple) wrong_type("list or tuple", *this);
  return node_->items;
}

const PyValue::Entries& PyValue::entries() const {
  if (type_ != Type::dict) wrong_type("dict", *this);
  return node_->entries;
}

std::size_t PyValue::size() const noexcept {
  switch (type_) {
    case Type::string:
    case Type::bytes: return node_->text.size();
    case Type::list:
    case Type::tuple: return node_->items.size();
    case Type::dict: return node_->entries.size();
    default: return 0;
  }
}

const PyValue* PyValue::get(std::string_view key) const noexcept {
  if (type_ != Type::dict) return nullptr;
  const Entries& e = node_->entries;
  for (auto it = e.rbegin(); it != e.rend(); ++it)
    if (it->first.type_ == Type::string && it->first.node_->text == key) return &it->second;
  return nullptr;
}

bool PyValue::hashable() const noexcept {
  if (type_ == Type::list || type_ == Type::dict) return false;
  if (type_ == Type::tuple)
    return std::all_of(node_->items.begin(), node_->items.end(),
                       [](const PyValue& v) { return v.hashable(); });
  return true;
}

void PyValue::append(PyValue v) {
  if (type_ != Type::list) wrong_type("list", *this);
  if (reaches(v, node_.get())) throw error("PyValue: appending a list to itself would make a cycle");
  check_depth(v.height() + 1);
  node_->height = std::max(node_->height, v.height() + 1);
  node_->items.push_back(std::move(v));
}

void PyValue::set(PyValue key, PyValue v) {
  if (type_ != Type::dict) wrong_type("dict", *this);
  if (!key.hashable()) throw error(fmt::format("PyValue: unhashable dict key of type {}", key.type_name()));
  if (reaches(v, node_.get()) || reaches(key, node_.get()))
    throw error("PyValue: putting a dict into itself would make a cycle");
  const std::uint32_t h = std::max(key.height(), v.height()) + 1;
  check_depth(h);
  node_->height = std::max(node_->height, h);
  node_->entries.emplace_back(std::move(key), std::move(v));
}

bool PyValue::operator==(const PyValue& b) const {
  const PyValue& a = *this;
  if (a.type_ != b.type_) return false;
  switch (a.type_) {
    case PyValue::Type::none: return true;
    case PyValue::Type::boolean: return a.b_ == b.b_;
    case PyValue::Type::integer:
      if (a.wide_ || b.wide_) return a.wide_ == b.wide_ && a.node_->text == b.node_->text;
      return a.big_ == b.big_ && a.u_ == b.u_;
    case PyValue::Type::floating: return a.f_ == b.f_;
    case PyValue::Type::string:
    case PyValue::Type::bytes: return a.node_->text == b.node_->text;
    case PyValue::Type::list:
    case PyValue::Type::tuple: return a.node_ == b.node_ || a.node_->items == b.node_->items;
    case PyValue::Type::dict: return a.node_ == b.node_ || a.node_->entries == b.node_->entries;
  }
  return false;
}

namespace {
void repr_into(const PyValue& v, std::string& out, std::size_t max) {
  if (out.size() > max) return;
  switch (v.type()) {
    case PyValue::Type::none: out += "None"; return;
    case PyValue::Type::boolean: out += v.as_bool() ? "True" : "False"; return;
    case PyValue::Type::integer:
      out += v.decimal();
      return;
    case PyValue::Type::floating: out += fmt::format("{}", v.as_float()); return;
    case PyValue::Type::string: out += fmt::format("'{}'", v.as_string()); return;
    case PyValue::Type::bytes: out += fmt::format("b'<{} bytes>'", v.size()); return;
    case PyValue::Type::list:
    case PyValue::Type::tuple: {
      const bool list = v.is_list();
      out += list ? '[' : '(';
      bool first = true;
      for (const PyValue& c : v.items()) {
        if (!first) out += ", ";
        first = false;
        repr_into(c, out, max);
        if (out.size() > max) return;
      }
      if (!list && v.size() == 1) out += ',';
      out += list ? ']' : ')';
      return;
    }
    case PyValue::Type::dict: {
      out += '{';
      bool first = true;
      for (const auto& [k, c] : v.entries()) {
        if (!first) out += ", ";
        first = false;
        repr_into(k, out, max);
        out += ": ";
        repr_into(c, out, max);
        if (out.size() > max) return;
      }
      out += '}';
      return;
    }
  }
}
}  // namespace

std::string PyValue::repr(std::size_t max_chars) const {
  std::string out;
  repr_into(*this, out, max_chars);
  if (out.size() > max_chars) {
    out.resize(max_chars);
    out += "...";
  }
  return out;
}
}  // namespace stitch::detail
