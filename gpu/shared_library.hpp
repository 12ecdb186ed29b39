// A shared library loaded at first use (dlopen) instead of linked: the
// emulated executor's OpenBLAS and the CUDA executor's cuBLAS, which most
// processes never call and every linked process would map and relocate at
// start (gpu/emulated.cpp and gpu/cuda/cuda.cu say what each costs).
#pragma once

#include <dlfcn.h>

#include <string>

namespace accumcheck::gpu_detail {

// `soname` looked up the way the linker would (RUNPATH, LD_LIBRARY_PATH,
// ld.so.cache), then in `dir` (the folder found at configure time).
// Returns the handle; nullptr with `error` saying why.
inline void* open_library(const std::string& soname, const std::string& dir,
                          std::string& error) {
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen((dir + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    error = "cannot load " + soname + ": " + (e ? e : "dlopen failed");
  }
  return lib;
}

// Symbol `name` of `lib` as the function pointer `f` (declared with the
// exact type of the function it names); the first one missing sets
// `error`.
template <class F>
void resolve(void* lib, const char* name, F& f, const std::string& soname,
             std::string& error) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f && error.empty()) error = soname + " has no " + name;
}

// `soname` opened (open_library) and every function of `api` resolved by
// `resolve_all(lib)` (ACCUMCHECK_LIBRARY_RESOLVE for each): the handle,
// or nullptr with api.error saying why.
template <class Api, class ResolveAll>
void* load_library(Api& api, const std::string& soname, const std::string& dir,
                   ResolveAll resolve_all) {
  void* lib = open_library(soname, dir, api.error);
  if (lib) resolve_all(lib);
  return api.error.empty() ? lib : nullptr;
}

}  // namespace accumcheck::gpu_detail

// A loaded library's API: `struct Api` with one pointer per function an
// X-macro list names (FUNCTIONS(X) calls X(f) for each), each of the exact
// type of the function it names (its header declares them all), and
// `error`, why it could not be loaded (empty when loaded).
#define ACCUMCHECK_LIBRARY_POINTER(f) decltype(&::f) f = nullptr;
#define ACCUMCHECK_LIBRARY_API(Api, FUNCTIONS) \
  struct Api {                                 \
    FUNCTIONS(ACCUMCHECK_LIBRARY_POINTER)      \
    std::string error;                         \
  }
// In load_library's resolve_all(lib), with `api` and `soname` in scope:
// function f of the list resolved by its symbol's name, f expanded first
// (cuBLAS's cublasCreate is the macro for cublasCreate_v2).
#define ACCUMCHECK_LIBRARY_NAME2(x) #x
#define ACCUMCHECK_LIBRARY_NAME(x) ACCUMCHECK_LIBRARY_NAME2(x)
#define ACCUMCHECK_LIBRARY_RESOLVE(f)                                       \
  ::accumcheck::gpu_detail::resolve(lib, ACCUMCHECK_LIBRARY_NAME(f), api.f, \
                                    soname, api.error);
