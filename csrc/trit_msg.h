// Refusal messages of the trit CUDA ops (csrc/bindings.cpp), put together without std::ostream.
//
// Why not TORCH_CHECK's own c10::str: on the H200 machine (torch 2.11+cu130, extensions built with that
// machine's g++ 13.3), streaming an integer into a std::ostream inside an extension crashes the process
// (SIGSEGV) - c10::str does that for every number of a TORCH_CHECK message, so every refusal with a number
// in it killed the process instead of raising, while messages of strings and dtypes raised (H200 runs 32-33,
// bench/results/2026-12-02-h200-run32-33.md; `python ci/ext_ostream_probe.py` checks a machine). Here
// integers go through std::to_string and sizes are written out by hand, so no number passes through an
// ostream; TORCH_CHECK then gets one finished std::string, which c10::str hands through unchanged.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <string>
#include <type_traits>

namespace trit_msg_detail {
inline void put(std::string& s, const char* v) { s += v; }
inline void put(std::string& s, const std::string& v) { s += v; }
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
inline void put(std::string& s, T v) { s += std::to_string(v); }
inline void put(std::string& s, c10::IntArrayRef v) {  // as torch prints sizes: [7, 896]
  s += "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  s += "]";
}
inline void put(std::string& s, c10::ScalarType t) { s += c10::toString(t); }
inline void put(std::string& s, const c10::Device& d) { s += d.str(); }
}  // namespace trit_msg_detail

// The arguments (strings, integers, sizes, dtypes, devices) concatenated as TORCH_CHECK would print them.
template <class... A>
std::string trit_msg(const A&... a) {
  std::string s;
  (trit_msg_detail::put(s, a), ...);
  return s;
}

// TORCH_CHECK with the message built by trit_msg (only when cond fails)
#define TRIT_CHECK(cond, ...)                                               \
  do {                                                                      \
    if (C10_UNLIKELY(!(cond))) TORCH_CHECK(false, trit_msg(__VA_ARGS__)); \
  } while (0)
