#include "sim/atomic_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "sim/errors.hpp"
#include "sim/limits.hpp"

namespace accumcheck {

namespace {

[[noreturn]] void fail(int err, const std::string& what) {
  throw std::system_error(err, std::generic_category(), what);
}

// The files FileBytes has mapped, for the SIGBUS a reader of one gets when
// the file is cut short under it (`cp` over it, `truncate`): the handler
// finds the faulting address's file and ends the process as an input
// error (exit 2, the file named), not a crash.  A slot is claimed by
// `taken`, filled, then published by `begin`; the handler reads only
// published slots.  Files beyond the table's slots are mapped unnamed
// (their SIGBUS is the previous handler's, or the default).
struct MappedFile {
  std::atomic<bool> taken{false};
  std::atomic<const char*> begin{nullptr};
  std::atomic<size_t> size{0};
  char path[1024] = {};
};
constexpr int kMappedFiles = 16;
MappedFile g_mapped[kMappedFiles];
struct sigaction g_previous_sigbus {};

void write_stderr(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= size_t(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void*) {
  if (info->si_code <= 0) {  // sent (kill, raise), not a fault: pass it on
    ::sigaction(SIGBUS, &g_previous_sigbus, nullptr);
    ::raise(sig);  // pending until this handler returns
    return;
  }
  const char* at = static_cast<const char*>(info->si_addr);
  for (const MappedFile& f : g_mapped) {
    const char* b = f.begin.load(std::memory_order_acquire);
    if (b && at >= b && at < b + f.size.load(std::memory_order_relaxed)) {
      write_stderr("accumcheck: ");
      write_stderr(f.path);
      write_stderr(
          ": the file was cut short while accumcheck was reading it "
          "(written over or truncated in place); expected it unchanged "
          "until accumcheck has finished\n");
      ::_exit(2);
    }
  }
  // Not one of ours: the previous handler (or the default) takes the
  // fault when the instruction runs again.
  ::sigaction(SIGBUS, &g_previous_sigbus, nullptr);
}

void install_sigbus_handler() {
  static const bool installed = [] {
    struct sigaction a {};
    a.sa_sigaction = on_sigbus;
    a.sa_flags = SA_SIGINFO;
    sigemptyset(&a.sa_mask);
    return ::sigaction(SIGBUS, &a, &g_previous_sigbus) == 0;
  }();
  (void)installed;
}

void name_mapping(const char* begin, size_t size, const std::string& path) {
  install_sigbus_handler();
  for (MappedFile& f : g_mapped) {
    bool expected = false;
    if (!f.taken.compare_exchange_strong(expected, true)) continue;
    const size_t n = std::min(path.size(), sizeof f.path - 1);
    std::memcpy(f.path, path.data(), n);
    f.path[n] = '\0';
    f.size.store(size, std::memory_order_relaxed);
    f.begin.store(begin, std::memory_order_release);
    return;
  }
}

void unname_mapping(const char* begin) {
  for (MappedFile& f : g_mapped)
    if (f.begin.load(std::memory_order_acquire) == begin) {
      f.begin.store(nullptr, std::memory_order_release);
      f.taken.store(false, std::memory_order_release);
      return;
    }
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) fail(errno, "cannot create " + tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail(err, "cannot write " + tmp);
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(err, "cannot flush " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(err, "cannot rename " + tmp + " to " + path);
  }
}

void advise_huge_pages(void* p, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (bytes < 2 * kHuge) return;
  const uintptr_t a =
      (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (e > a) (void)::madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
}

std::string read_file_bytes(const std::string& path,
                            std::string_view limit_key) {
  // A folder, a device or a file over the limit is refused before reading.
  require_file_within_limit(path, limit_key);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw InputError(path, 0, 0, "",
                     std::string("cannot open file: ") + std::strerror(errno));
  // Read straight into a string of the file's size (a stringstream grows
  // by copying: 1.6 GB of values.bin was copied about three times).
  struct stat st {};
  std::string bytes;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    bytes.reserve(size_t(st.st_size));
    advise_huge_pages(bytes.data(), bytes.capacity());
    bytes.resize(size_t(st.st_size));
  }
  size_t got = 0;
  for (;;) {
    if (got == bytes.size()) {  // grown since fstat, or of unknown size
      require_within(limit_key, int64_t(got) + 1,
                     fmt::format("more than {} bytes", got), path, 0, 0, "");
      bytes.resize(got + (size_t(1) << 16));
    }
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw InputError(path, 0, 0, "",
                       std::string("cannot read file: ") + std::strerror(e));
    }
    if (n == 0) break;
    got += size_t(n);
  }
  ::close(fd);
  bytes.resize(got);
  return bytes;
}

FileBytes::FileBytes(const std::string& path, std::string_view limit_key) {
  require_file_within_limit(path, limit_key);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      void* p = ::mmap(nullptr, size_t(st.st_size), PROT_READ,
                       MAP_PRIVATE | MAP_POPULATE, fd, 0);
      if (p != MAP_FAILED) {
        map_ = static_cast<const char*>(p);
        size_ = size_t(st.st_size);
        name_mapping(map_, size_, path);
      }
    }
    ::close(fd);
    if (map_) return;
  }
  // Empty, not mappable, or not opened: read_file_bytes reads it or says
  // why not.
  read_ = read_file_bytes(path, limit_key);
}

void FileBytes::release() {
  if (map_) {
    unname_mapping(map_);
    ::munmap(const_cast<char*>(map_), size_);
  }
  map_ = nullptr;
  size_ = 0;
  read_.clear();
}

FileBytes::~FileBytes() { release(); }

FileBytes::FileBytes(FileBytes&& o) noexcept
    : map_(o.map_), size_(o.size_), read_(std::move(o.read_)) {
  o.map_ = nullptr;
  o.size_ = 0;
}

FileBytes& FileBytes::operator=(FileBytes&& o) noexcept {
  if (this != &o) {
    release();
    map_ = o.map_;
    size_ = o.size_;
    read_ = std::move(o.read_);
    o.map_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void require_output_folder(const std::string& dir, const std::string& option) {
  namespace fs = std::filesystem;
  if (dir.empty())
    throw InputError("", 0, 0, option, "expected a folder, got ''");
  std::error_code ec;
  fs::path p = fs::path(dir).lexically_normal();
  if (fs::exists(p, ec) && !fs::is_directory(p, ec))
    throw InputError(p.string(), 0, 0, option,
                     "exists and is not a folder; expected a folder (or a "
                     "path to create one)");
  // The nearest existing ancestor must be a writable folder.
  fs::path a = fs::absolute(p, ec);
  while (!a.empty() && !fs::exists(a, ec)) {
    if (a == a.parent_path()) break;
    a = a.parent_path();
  }
  if (!fs::is_directory(a, ec))
    throw InputError(p.string(), 0, 0, option,
                     "cannot create this folder: " + a.string() +
                         " on its path is a file, not a folder");
  if (::access(a.c_str(), W_OK | X_OK) != 0)
    throw InputError(p.string(), 0, 0, option,
                     "cannot create or write this folder: " + a.string() +
                         ": " + std::strerror(errno));
}

void require_output_file(const std::string& path, const std::string& option) {
  namespace fs = std::filesystem;
  if (path.empty())
    throw InputError("", 0, 0, option, "expected a file, got ''");
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec))
    throw InputError(path, 0, 0, option, "is a folder, expected a file name");
  const fs::path parent = fs::absolute(p, ec).parent_path();
  require_output_folder(parent.string(), option);
  if (fs::exists(p, ec) && ::access(p.c_str(), W_OK) != 0)
    throw InputError(
        path, 0, 0, option,
        std::string("cannot write this file: ") + std::strerror(errno));
}

void write_output_file(const std::string& path, std::string_view bytes,
                       const std::string& option) {
  namespace fs = std::filesystem;
  require_output_file(path, option);
  try {
    const fs::path parent = fs::absolute(fs::path(path)).parent_path();
    fs::create_directories(parent);
    write_file_atomically(path, bytes);
  } catch (const std::system_error& e) {
    throw InputError(path, 0, 0, option, e.what());
  }
}

}  // namespace accumcheck
