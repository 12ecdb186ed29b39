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

}  // namespace accumcheck::gpu_detail
