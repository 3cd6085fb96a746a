// diagnostics/py_value.cpp — PyValue: construction, typed access, equality and repr.
#include "diagnostics/py_value.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "stitch/errors.hpp"

namespace stitch::detail {

// ---- PyValue ------------------------------------------------------------------------------------

namespace {

std::shared_ptr<PyValue::Node> new_node() { return std::make_shared<PyValue::Node>(); }

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

namespace {
[[noreturn]] void wrong_type(const char* expected, const PyValue& v) {
  throw error(fmt::format("expected {}, got {}", expected, v.type_name()));
}
}  // namespace

bool PyValue::as_bool() const {
  if (type_ != Type::boolean) wrong_type("bool", *this);
  return b_;
}

std::int64_t PyValue::as_int() const {
  if (type_ != Type::integer) wrong_type("int", *this);
  if (big_) throw error(fmt::format("int {} does not fit in a signed 64-bit integer", u_));
  return static_cast<std::int64_t>(u_);
}

std::uint64_t PyValue::as_uint() const {
  if (type_ != Type::integer) wrong_type("int", *this);
  if (!big_ && static_cast<std::int64_t>(u_) < 0)
    throw error(fmt::format("expected a non-negative int, got {}", static_cast<std::int64_t>(u_)));
  return u_;
}

double PyValue::as_float() const {
  if (type_ == Type::floating) return f_;
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

bool operator==(const PyValue& a, const PyValue& b) {
  if (a.type_ != b.type_) return false;
  switch (a.type_) {
    case PyValue::Type::none: return true;
    case PyValue::Type::boolean: return a.b_ == b.b_;
    case PyValue::Type::integer: return a.big_ == b.big_ && a.u_ == b.u_;
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
      out += v.is_big() ? std::to_string(v.as_uint()) : std::to_string(v.as_int());
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
