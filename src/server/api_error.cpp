#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace kestrel::server {

std::string ApiError::default_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "internal_server_error" : "invalid_request_error";
  }
}

std::string error_body(int status, const std::string& message, const std::string& type, const std::string& param,
                       const std::string& code) {
  nlohmann::ordered_json body;
  body["error"] = {{"message", message},
                   {"type", type},
                   {"param", param.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(param)},
                   {"code", code.empty() ? nlohmann::ordered_json(status) : nlohmann::ordered_json(code)}};
  // Messages may quote client bytes: never let invalid UTF-8 break the error itself.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kestrel::server
