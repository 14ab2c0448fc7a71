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
 * dlopen is interposed for one case only: RTLD_DEEPBIND puts a library's own dependencies (the real
 * driver among them) ahead of the global scope where the preloaded hooks are, so its calls would reach
 * the driver directly. After such a dlopen, the GOT slots of every loaded object that point at a real
 * driver function gpuslice hooks are pointed at the hook instead (what the binding would have been
 * without RTLD_DEEPBIND). Any other dlopen is a tail call, and so is a DEEPBIND dlopen whose file name
 * the loader would search for with the caller's RPATH/RUNPATH (no '/') or expand relative to the
 * caller ('$'): glibc reads the caller from the return address, which must stay the caller's.
 *
 * The interposers are named gpuslice_interposed_dlsym, _dlvsym and _dlopen here; only libgpuslice.so
 * exports them as dlsym, dlvsym and dlopen (interpose-names.S, linked into the cdylib alone). This object
 * also travels in the gpuslice rlib, which the command line and the node tools link: a definition
 * named dlsym there would bind those programs' own dlsym calls (libloading's) to the interposer,
 * and their NVML lookups to gpuslice's hooks. Those programs are not tenants: their lookups must
 * reach the real driver.
 *
 * glibc's own dlsym/dlvsym are found without calling dlsym (which would be ourselves): libc's dynamic
 * symbol table is read through its link_map. That lookup neither allocates nor takes a lock of ours: a
 * malloc interposer calls dlsym(RTLD_NEXT, "malloc") from inside its malloc, which can run inside the
 * loader (dlopen) or inside our own first lookup, and must find us ready to answer, not waiting.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <sys/mman.h>
#include <unistd.h>

/* Hidden: interpose-names.S jumps to them directly, and no other object needs their names. */
#define GPUSLICE_HIDDEN __attribute__((visibility("hidden")))

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlopen_fn)(const char *, int);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);

/* Rust: returns the answer for a hookable name (hook or real result), or 0 to forward. */
extern void *gpuslice_dlsym_hook(void *handle, const char *name, const char *version, int *answered);
/* Rust: the hook for `name` when `current` is the real driver's function of that name, else 0. */
extern void *gpuslice_rebind(const char *name, void *current);

/* Set once resolved (atomically: threads racing to resolve store the same values). */
static dlsym_fn real_dlsym_ptr;
static dlvsym_fn real_dlvsym_ptr;
static dlopen_fn real_dlopen_ptr;

/* An address from the dynamic section: glibc relocates these entries in place where the section is
 * writable (x86_64, aarch64); where it is not, they are still offsets from the load base. */
static ElfW(Addr) dyn_ptr(ElfW(Addr) base, ElfW(Addr) value) { return value < base ? base + value : value; }

/* Looks `name` up in the dynamic symbol table of the object loaded at `base` with dynamic section
 * `dyn`, preferring the default (non-hidden) version. Uses the GNU hash table, which every glibc since
 * 2.5 carries. */
static void *elf_lookup(ElfW(Addr) base, const ElfW(Dyn) *dyn, const char *name) {
  const ElfW(Sym) *symtab = NULL;
  const char *strtab = NULL;
  const uint32_t *gnu_hash = NULL;
  const ElfW(Half) *versym = NULL;
  for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
    case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_ptr(base, d->d_un.d_ptr); break;
    case DT_STRTAB: strtab = (const char *)dyn_ptr(base, d->d_un.d_ptr); break;
    case DT_GNU_HASH: gnu_hash = (const uint32_t *)dyn_ptr(base, d->d_un.d_ptr); break;
    case DT_VERSYM: versym = (const ElfW(Half) *)dyn_ptr(base, d->d_un.d_ptr); break;
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
      void *addr = (void *)(base + symtab[i].st_value);
      if (!versym || !(versym[i] & 0x8000)) return addr; /* the default version */
      if (!fallback) fallback = addr;
    }
    if (ch & 1) break;
  }
  return fallback;
}

/* The loaded object that contains `target`: its load base and dynamic section. */
struct object_of {
  ElfW(Addr) target;
  ElfW(Addr) base;
  const ElfW(Dyn) *dyn;
};

static int find_object(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  struct object_of *o = data;
  const ElfW(Dyn) *dyn = NULL;
  int contains = 0;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    ElfW(Addr) start = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && o->target >= start && o->target < start + ph->p_memsz) contains = 1;
    if (ph->p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)start;
  }
  if (!contains || !dyn) return 0;
  o->base = info->dlpi_addr;
  o->dyn = dyn;
  return 1;
}

static void resolve_real(void) {
  /* dlsym/dlvsym live where dladdr lives: libc.so.6 since glibc 2.34, libdl.so.2 before. Its object is
   * found by address with dl_iterate_phdr: no dlopen (which allocates, and so may re-enter us through a
   * malloc interposer) and no symbol search (dladdr's costs tens of thousands of instructions). */
  struct object_of o = {(ElfW(Addr))(void *)&dladdr, 0, NULL};
  if (!dl_iterate_phdr(find_object, &o) || !o.dyn) return;
  dlsym_fn s = (dlsym_fn)elf_lookup(o.base, o.dyn, "dlsym");
  dlvsym_fn v = (dlvsym_fn)elf_lookup(o.base, o.dyn, "dlvsym");
  dlopen_fn d = (dlopen_fn)elf_lookup(o.base, o.dyn, "dlopen");
  if (d) __atomic_store_n(&real_dlopen_ptr, d, __ATOMIC_RELEASE);
  if (s) __atomic_store_n(&real_dlsym_ptr, s, __ATOMIC_RELEASE);
  if (v) __atomic_store_n(&real_dlvsym_ptr, v, __ATOMIC_RELEASE);
}

static inline dlsym_fn get_real_dlsym(void) {
  dlsym_fn f = __atomic_load_n(&real_dlsym_ptr, __ATOMIC_ACQUIRE);
  if (!f) {
    resolve_real();
    f = __atomic_load_n(&real_dlsym_ptr, __ATOMIC_ACQUIRE);
  }
  return f;
}

static inline dlvsym_fn get_real_dlvsym(void) {
  dlvsym_fn f = __atomic_load_n(&real_dlvsym_ptr, __ATOMIC_ACQUIRE);
  if (!f) {
    resolve_real();
    f = __atomic_load_n(&real_dlvsym_ptr, __ATOMIC_ACQUIRE);
  }
  return f;
}

/* glibc's dlsym, for gpuslice's own lookups (never the interposer). */
void *gpuslice_real_dlsym(void *handle, const char *name) {
  dlsym_fn f = get_real_dlsym();
  return f ? f(handle, name) : NULL;
}

void *gpuslice_real_dlvsym(void *handle, const char *name, const char *version) {
  dlvsym_fn f = get_real_dlvsym();
  return f ? f(handle, name, version) : NULL;
}

static inline int may_hook(const char *name) {
  return name && name[0] == 'c' && name[1] == 'u' ? 1 : name && strncmp(name, "nvml", 4) == 0;
}

GPUSLICE_HIDDEN void *gpuslice_interposed_dlsym(void *handle, const char *name) {
  if (may_hook(name)) {
    int answered = 0;
    void *p = gpuslice_dlsym_hook(handle, name, NULL, &answered);
    if (answered) return p;
  }
  dlsym_fn f = get_real_dlsym();
  if (!f) return NULL;
  /* Tail call: glibc attributes the lookup (RTLD_NEXT) to our caller. */
  return f(handle, name);
}

GPUSLICE_HIDDEN void *gpuslice_interposed_dlvsym(void *handle, const char *name, const char *version) {
  if (may_hook(name)) {
    int answered = 0;
    void *p = gpuslice_dlsym_hook(handle, name, version, &answered);
    if (answered) return p;
  }
  dlvsym_fn f = get_real_dlvsym();
  if (!f) return NULL;
  return f(handle, name, version);
}

static inline dlopen_fn get_real_dlopen(void) {
  dlopen_fn f = __atomic_load_n(&real_dlopen_ptr, __ATOMIC_ACQUIRE);
  if (!f) {
    resolve_real();
    f = __atomic_load_n(&real_dlopen_ptr, __ATOMIC_ACQUIRE);
  }
  return f;
}

#if defined(__x86_64__)
#define JUMP_SLOT R_X86_64_JUMP_SLOT
#define GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define JUMP_SLOT R_AARCH64_JUMP_SLOT
#define GLOB_DAT R_AARCH64_GLOB_DAT
#endif

#if defined(JUMP_SLOT) && defined(__LP64__)
/* Points `slot` at `value`, making its page writable for the store if it is not (RELRO), and
 * read-only again afterwards when it lies in the object's RELRO range. */
static void store_slot(void **slot, void *value, ElfW(Addr) relro_start, ElfW(Addr) relro_end) {
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t at = (uintptr_t)slot;
  void *first = (void *)(at & ~(page - 1));
  const int relro = at >= relro_start && at < relro_end;
  if (relro && mprotect(first, page, PROT_READ | PROT_WRITE) != 0) return;
  __atomic_store_n(slot, value, __ATOMIC_RELEASE);
  if (relro) mprotect(first, page, PROT_READ);
}

/* Rebinds the hookable GOT slots of one relocation table of the object at `base`. */
static void rebind_table(ElfW(Addr) base, const ElfW(Rela) *rel, size_t bytes, const ElfW(Sym) *symtab,
                         const char *strtab, ElfW(Addr) relro_start, ElfW(Addr) relro_end) {
  for (size_t i = 0; i < bytes / sizeof *rel; ++i) {
    const unsigned type = (unsigned)ELF64_R_TYPE(rel[i].r_info);
    if (type != JUMP_SLOT && type != GLOB_DAT) continue;
    const char *name = strtab + symtab[ELF64_R_SYM(rel[i].r_info)].st_name;
    if (!(name[0] == 'c' && name[1] == 'u') && strncmp(name, "nvml", 4) != 0) continue;
    void **slot = (void **)(base + rel[i].r_offset);
    void *hook = gpuslice_rebind(name, __atomic_load_n(slot, __ATOMIC_ACQUIRE));
    if (hook) store_slot(slot, hook, relro_start, relro_end);
  }
}

static int rebind_object(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  (void)data;
  const ElfW(Dyn) *dyn = NULL;
  ElfW(Addr) relro_start = 0, relro_end = 0;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(info->dlpi_addr + ph->p_vaddr);
    if (ph->p_type == PT_GNU_RELRO) {
      relro_start = info->dlpi_addr + ph->p_vaddr;
      relro_end = relro_start + ph->p_memsz;
    }
  }
  if (!dyn) return 0;
  const ElfW(Addr) base = info->dlpi_addr;
  const ElfW(Sym) *symtab = NULL;
  const char *strtab = NULL;
  const ElfW(Rela) *jmprel = NULL, *rela = NULL;
  size_t jmprel_bytes = 0, rela_bytes = 0;
  int plt_is_rela = 1;
  for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
    case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_ptr(base, d->d_un.d_ptr); break;
    case DT_STRTAB: strtab = (const char *)dyn_ptr(base, d->d_un.d_ptr); break;
    case DT_JMPREL: jmprel = (const ElfW(Rela) *)dyn_ptr(base, d->d_un.d_ptr); break;
    case DT_PLTRELSZ: jmprel_bytes = d->d_un.d_val; break;
    case DT_PLTREL: plt_is_rela = d->d_un.d_val == DT_RELA; break;
    case DT_RELA: rela = (const ElfW(Rela) *)dyn_ptr(base, d->d_un.d_ptr); break;
    case DT_RELASZ: rela_bytes = d->d_un.d_val; break;
    default: break;
    }
  }
  if (!symtab || !strtab) return 0;
  if (jmprel && plt_is_rela) rebind_table(base, jmprel, jmprel_bytes, symtab, strtab, relro_start, relro_end);
  if (rela) rebind_table(base, rela, rela_bytes, symtab, strtab, relro_start, relro_end);
  return 0;
}

static inline int caller_relative(const char *file) {
  return file == NULL || strchr(file, '/') == NULL || strchr(file, '$') != NULL;
}

GPUSLICE_HIDDEN void *gpuslice_interposed_dlopen(const char *file, int flags) {
  dlopen_fn f = get_real_dlopen();
  if (!f) return NULL;
  if (!(flags & RTLD_DEEPBIND) || caller_relative(file)) return f(file, flags); /* tail call */
  /* Bound now, so every slot holds its final target when it is rebound. A library that cannot be
   * bound now (a symbol nothing defines, which lazy binding never looks up) is opened as asked: its
   * lazily bound driver calls then escape, as they would without this interposer. */
  void *handle = f(file, flags | RTLD_NOW);
  if (!handle) handle = f(file, flags);
  if (handle) dl_iterate_phdr(rebind_object, NULL);
  return handle;
}
#else
GPUSLICE_HIDDEN void *gpuslice_interposed_dlopen(const char *file, int flags) {
  dlopen_fn f = get_real_dlopen();
  return f ? f(file, flags) : NULL;
}
#endif
