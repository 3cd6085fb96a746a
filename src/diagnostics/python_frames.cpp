// diagnostics/python_frames.cpp — PythonFrames: CPython's frame API through dlsym.
#include "diagnostics/python_frames.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace stitch::detail {

namespace {

// The C API calls used (CPython 3.9+; all exported functions of the stable API).
struct PyApi {
  int (*is_initialized)() = nullptr;                  // Py_IsInitialized
  int (*is_finalizing)() = nullptr;                   // Py_IsFinalizing (3.13) / _Py_IsFinalizing
  int (*gil_ensure)() = nullptr;                      // PyGILState_Ensure (an enum, as int)
  void (*gil_release)(int) = nullptr;                 // PyGILState_Release
  void* (*get_frame)() = nullptr;                     // PyEval_GetFrame: borrowed
  void* (*frame_back)(void*) = nullptr;               // PyFrame_GetBack: new reference
  void* (*frame_code)(void*) = nullptr;               // PyFrame_GetCode: new reference
  int (*frame_line)(void*) = nullptr;                 // PyFrame_GetLineNumber
  void* (*get_attr)(void*, const char*) = nullptr;    // PyObject_GetAttrString: new reference
  const char* (*utf8)(void*) = nullptr;               // PyUnicode_AsUTF8
  void (*err_clear)() = nullptr;                      // PyErr_Clear
  void (*incref)(void*) = nullptr;                    // Py_IncRef
  void (*decref)(void*) = nullptr;                    // Py_DecRef
  bool ok = false;
};

template <typename Fn>
bool find(Fn& fn, const char* name) {
  void* p = ::dlsym(RTLD_DEFAULT, name);
  std::memcpy(&fn, &p, sizeof fn);
  return p != nullptr;
}

const PyApi& api() {
  static PyApi a;
  static std::once_flag once;
  std::call_once(once, [] {
    if (!find(a.is_finalizing, "Py_IsFinalizing")) (void)find(a.is_finalizing, "_Py_IsFinalizing");
    a.ok = find(a.is_initialized, "Py_IsInitialized") && find(a.gil_ensure, "PyGILState_Ensure") &&
           find(a.gil_release, "PyGILState_Release") && find(a.get_frame, "PyEval_GetFrame") &&
           find(a.frame_back, "PyFrame_GetBack") && find(a.frame_code, "PyFrame_GetCode") &&
           find(a.frame_line, "PyFrame_GetLineNumber") &&
           find(a.get_attr, "PyObject_GetAttrString") && find(a.utf8, "PyUnicode_AsUTF8") &&
           find(a.err_clear, "PyErr_Clear") && find(a.incref, "Py_IncRef") &&
           find(a.decref, "Py_DecRef");
  });
  return a;
}

constexpr std::uintptr_t kTag = std::uintptr_t{1} << 63;
constexpr int kLineBits = 24;
constexpr std::uintptr_t kLineMask = (std::uintptr_t{1} << kLineBits) - 1;

// The code objects seen so far, process-wide. Never destroyed: allocations may be recorded while
// the process exits.
struct CodeCache {
  struct Code {
    std::string filename;
    std::string name;
  };
  std::mutex mutex;
  std::unordered_map<const void*, std::uint32_t> index;  // code object -> codes position
  std::vector<Code> codes;
};
CodeCache& cache() {
  static auto* c = new CodeCache;
  return *c;
}

// A string attribute of a code object ("?" when it has none). The GIL is held.
std::string text_attr(const PyApi& py, void* code, const char* attr) {
  void* v = py.get_attr(code, attr);
  if (v == nullptr) {
    py.err_clear();
    return "?";
  }
  const char* s = py.utf8(v);
  std::string out = s != nullptr ? s : "?";
  if (s == nullptr) py.err_clear();
  py.decref(v);
  return out;
}

// The code object's index in the cache, adding it (and keeping it alive) at the first sight.
std::uint32_t code_index(const PyApi& py, void* code) {
  CodeCache& c = cache();
  std::lock_guard lock(c.mutex);
  auto it = c.index.find(code);
  if (it != c.index.end()) return it->second;
  c.codes.push_back(CodeCache::Code{text_attr(py, code, "co_filename"), text_attr(py, code, "co_name")});
  it = c.index.emplace(code, static_cast<std::uint32_t>(c.codes.size() - 1)).first;
  py.incref(code);  // kept alive: its address stays its identity in the index
  return it->second;
}

struct Gathered {
  int count = 0;
  std::uintptr_t words[PythonFrames::kMaxFrames];
};
thread_local Gathered t_gathered;

}  // namespace

void PythonFrames::gather() noexcept {
  Gathered& g = t_gathered;
  g.count = 0;
  const PyApi& py = api();
  if (!py.ok || py.is_initialized() == 0) return;
  if (py.is_finalizing != nullptr && py.is_finalizing() != 0) return;
  const int gil = py.gil_ensure();
  void* frame = py.get_frame();  // borrowed
  if (frame != nullptr) py.incref(frame);  // owned from here, like PyFrame_GetBack's
  try {
    while (frame != nullptr && g.count < kMaxFrames) {
      void* code = py.frame_code(frame);
      if (code == nullptr) break;
      const std::uint32_t index = code_index(py, code);
      const int line = py.frame_line(frame);
      g.words[g.count++] = kTag | (std::uintptr_t{index} << kLineBits) |
                           (static_cast<std::uintptr_t>(line < 0 ? 0 : line) & kLineMask);
      py.decref(code);
      void* back = py.frame_back(frame);
      py.decref(frame);
      frame = back;
    }
  } catch (...) {  // no host memory for the cache: the frames taken so far are kept
  }
  if (frame != nullptr) py.decref(frame);
  py.gil_release(gil);
}

void PythonFrames::release() noexcept { t_gathered.count = 0; }

int PythonFrames::copy(std::uintptr_t* out, int max) noexcept {
  const Gathered& g = t_gathered;
  const int n = g.count < max ? g.count : max;
  std::memcpy(out, g.words, static_cast<std::size_t>(n) * sizeof(std::uintptr_t));
  return n;
}

std::string PythonFrames::describe(std::uintptr_t word) {
  const std::size_t index = (word & ~kTag) >> kLineBits;
  const auto line = static_cast<unsigned long long>(word & kLineMask);
  CodeCache& c = cache();
  std::lock_guard lock(c.mutex);
  if (index >= c.codes.size()) return fmt::format("? (?:{})", line);
  return fmt::format("{} ({}:{})", c.codes[index].name, c.codes[index].filename, line);
}

}  // namespace stitch::detail
