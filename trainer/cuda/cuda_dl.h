/* cuda_dl: loading the toolkit's shared libraries (cuBLAS, NCCL) at run time, when an
 * engine or a communicator first needs them, instead of linking them: linked, they cost
 * every process about 0.4 s and 230 MB at start-up, and almost no process uses a GPU.
 * C++, for the .cu files of trainer/ only.
 *
 * Invariants:
 * - Nothing here keeps state: the caller owns the handle cuda_dl_open returns and the
 *   function pointers cuda_dl_sym fills, and dlcloses the handle when done with them.
 * - Libraries are opened RTLD_NODELETE: dlclose gives the handle back but never unmaps the
 *   code, because NCCL leaves threads running in it (ncclGetUniqueId starts the bootstrap
 *   root) and the status strings both libraries return may be read after the close.
 * - Failures are written to the caller's buffer as a whole message; nothing prints. */
#ifndef NAS_TRAINER_CUDA_DL_H
#define NAS_TRAINER_CUDA_DL_H

#include <dlfcn.h>

#include <cstdio>

/* The lib64 folder of the toolkit built against (the Makefile passes it to nvcc). */
#ifndef NAS_CUDA_LIBDIR
#error "NAS_CUDA_LIBDIR must name the CUDA toolkit's library folder (see the Makefile)"
#endif

/* The exported name of a function as a string. The argument is macro-expanded before it
 * is quoted, so a name a header renames (cublas_v2.h: cublasCreate is cublasCreate_v2)
 * gives the symbol the library exports. */
#define CUDA_DL_NAME(fn) CUDA_DL_QUOTE(fn)
#define CUDA_DL_QUOTE(fn) #fn

static inline const char *cuda_dl_why(void) {
  const char *why = dlerror();
  return why ? why : "unknown dlerror";
}

/* Opens the first of sonames (NULL-terminated, most wanted first) that loads, each tried
 * as NAS_CUDA_LIBDIR/soname and then by its bare name (LD_LIBRARY_PATH, the executable's
 * RUNPATH, ld.so's cache). NULL when none loads, with msg "<what>: cannot load <first
 * soname>: <dlerror of the first try> (...)". */
static inline void *cuda_dl_open(const char *what, const char *const *sonames, char *msg,
                                 size_t cap) {
  char first_why[512] = "";
  for (const char *const *soname = sonames; *soname; soname++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", NAS_CUDA_LIBDIR, *soname);
    for (const char *name : {static_cast<const char *>(path), *soname}) {
      void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
      if (lib) return lib;
      if (!first_why[0]) snprintf(first_why, sizeof first_why, "%s", cuda_dl_why());
    }
  }
  snprintf(msg, cap,
           "%s: cannot load %s: %s (install the CUDA toolkit's libraries or set "
           "LD_LIBRARY_PATH)",
           what, sonames[0], first_why);
  return nullptr;
}

/* *slot = the function name of lib, typed by the declaration slot was declared from
 * (decltype of the header's prototype, so the two cannot drift apart). false, with msg,
 * when lib does not export it. */
template <typename Fn>
static inline bool cuda_dl_sym(void *lib, const char *what, const char *name, Fn *slot, char *msg,
                               size_t cap) {
  void *sym = dlsym(lib, name);
  if (!sym) {
    snprintf(msg, cap, "%s: the loaded library has no %s: %s", what, name, cuda_dl_why());
    return false;
  }
  *slot = reinterpret_cast<Fn>(sym);
  return true;
}

#endif
