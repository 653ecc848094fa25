// Status propagation macros (Debian's Abseil 20220623 predates Abseil's own).
//
//   PP_RETURN_IF_ERROR(DoThing());
//   PP_ASSIGN_OR_RETURN(Bounds bounds, Partition(costs, parts));
#ifndef COMMON_STATUS_MACROS_H_
#define COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PP_STATUS_CONCAT_INNER_(a, b) a##b
#define PP_STATUS_CONCAT_(a, b) PP_STATUS_CONCAT_INNER_(a, b)

#define PP_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status pp_status_ = (expr);      \
    if (!pp_status_.ok()) return pp_status_; \
  } while (false)

#define PP_ASSIGN_OR_RETURN(lhs, expr) \
  PP_ASSIGN_OR_RETURN_IMPL_(PP_STATUS_CONCAT_(pp_statusor_, __LINE__), lhs, expr)

#define PP_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)     \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // COMMON_STATUS_MACROS_H_
