/*
 * gpuslice's dlsym/dlvsym interposer.
 *
 * Programs such as cudarc, numba or PyTorch's lazy loaders do dlopen("libcuda.so.1") + dlsym(handle, name).
 * A lookup on a library handle never reaches a preloaded export, so gpuslice exports dlsym and dlvsym
 * itself: names that may be hooked (cu..., nvml...) go to gpuslice_dlsym_hook (Rust), which answers with
 * the hook only when the lookup would have returned the real driver's own function; every other lookup
 * is forwarded untouched.
 *
 * The forward is a tail call, so glibc's dlsym still sees the *caller's* return address: RTLD_NEXT keeps
 * its meaning for other interposers (jemalloc, OpenMP runtimes, profilers).
 *
 * glibc's own dlsym/dlvsym are found without calling dlsym (which would be ourselves): libc's dynamic
 * symbol table is read through its link_map.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);

/* Rust: returns the answer for a hookable name (hook or real result), or 0 to forward. */
extern void *gpuslice_dlsym_hook(void *handle, const char *name, const char *version, int *answered);

static dlsym_fn real_dlsym_ptr;
static dlvsym_fn real_dlvsym_ptr;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

/* Looks `name` up in the dynamic symbol table of the object described by `map`, preferring the default
 * (non-hidden) version. Uses the GNU hash table, which every glibc since 2.5 carries. */
static void *elf_lookup(const struct link_map *map, const char *name) {
  const ElfW(Sym) *symtab = NULL;
  const char *strtab = NULL;
  const uint32_t *gnu_hash = NULL;
  const ElfW(Half) *versym = NULL;
  for (const ElfW(Dyn) *d = map->l_ld; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
    case DT_SYMTAB: symtab = (const ElfW(Sym) *)d->d_un.d_ptr; break;
    case DT_STRTAB: strtab = (const char *)d->d_un.d_ptr; break;
    case DT_GNU_HASH: gnu_hash = (const uint32_t *)d->d_un.d_ptr; break;
    case DT_VERSYM: versym = (const ElfW(Half) *)d->d_un.d_ptr; break;
    default: break;
    }
  }
  if (!symtab || !strtab || !gnu_hash) return NULL;
  uint32_t h = 5381;
  for (const unsigned char *p = (const unsigned char *)name; *p; ++p) h = h * 33 + *p;
  const uint32_t nbuckets = gnu_hash[0], symoffset = gnu_hash[1], bloom_size = gnu_hash[2];
  const uint32_t *buckets = gnu_hash + 4 + bloom_size * (sizeof(ElfW(Addr)) / 4);
  const uint32_t *chain = buckets + nbuckets;
  uint32_t i = buckets[h % nbuckets];
  if (i < symoffset) return NULL;
  void *fallback = NULL;
  for (;; ++i) {
    const uint32_t ch = chain[i - symoffset];
    if ((ch | 1) == (h | 1) && strcmp(strtab + symtab[i].st_name, name) == 0 && symtab[i].st_value != 0) {
      void *addr = (void *)(map->l_addr + symtab[i].st_value);
      if (!versym || !(versym[i] & 0x8000)) return addr; /* the default version */
      if (!fallback) fallback = addr;
    }
    if (ch & 1) break;
  }
  return fallback;
}

static void resolve_real(void) {
  /* dlsym/dlvsym live in libc.so.6 since glibc 2.34, in libdl.so.2 before. */
  static const char *const libs[] = {"libc.so.6", "libdl.so.2"};
  for (size_t k = 0; k < sizeof libs / sizeof libs[0] && (!real_dlsym_ptr || !real_dlvsym_ptr); ++k) {
    void *h = dlopen(libs[k], RTLD_LAZY | RTLD_NOLOAD);
    struct link_map *map = NULL;
    if (!h || dlinfo(h, RTLD_DI_LINKMAP, &map) != 0 || !map) continue;
    if (!real_dlsym_ptr) real_dlsym_ptr = (dlsym_fn)elf_lookup(map, "dlsym");
    if (!real_dlvsym_ptr) real_dlvsym_ptr = (dlvsym_fn)elf_lookup(map, "dlvsym");
    dlclose(h);
  }
}

/* glibc's dlsym, for gpuslice's own lookups (never the interposer). */
void *gpuslice_real_dlsym(void *handle, const char *name) {
  pthread_once(&real_once, resolve_real);
  return real_dlsym_ptr ? real_dlsym_ptr(handle, name) : NULL;
}

void *gpuslice_real_dlvsym(void *handle, const char *name, const char *version) {
  pthread_once(&real_once, resolve_real);
  return real_dlvsym_ptr ? real_dlvsym_ptr(handle, name, version) : NULL;
}

static inline int may_hook(const char *name) {
  return name && name[0] == 'c' && name[1] == 'u' ? 1 : name && strncmp(name, "nvml", 4) == 0;
}

void *dlsym(void *handle, const char *name) {
  if (may_hook(name)) {
    int answered = 0;
    void *p = gpuslice_dlsym_hook(handle, name, NULL, &answered);
    if (answered) return p;
  }
  pthread_once(&real_once, resolve_real);
  /* Tail call: glibc attributes the lookup (RTLD_NEXT) to our caller. */
  return real_dlsym_ptr(handle, name);
}

void *dlvsym(void *handle, const char *name, const char *version) {
  if (may_hook(name)) {
    int answered = 0;
    void *p = gpuslice_dlsym_hook(handle, name, version, &answered);
    if (answered) return p;
  }
  pthread_once(&real_once, resolve_real);
  return real_dlvsym_ptr(handle, name, version);
}
