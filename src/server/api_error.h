// OpenAI-style API errors: {"error": {"message", "type", "param", "code"}} with an HTTP status. Handlers throw
// ApiError for anything the client got wrong; the router turns it (and kestrel::Error, as a 400) into a response.
#pragma once

#include <stdexcept>
#include <string>

namespace kestrel::server {

struct ApiError : std::runtime_error {
  ApiError(int status_, std::string message, std::string param_ = {}, std::string type_ = {}, std::string code_ = {})
      : std::runtime_error(std::move(message)),
        status(status_),
        param(std::move(param_)),
        type(type_.empty() ? default_type(status_) : std::move(type_)),
        code(std::move(code_)) {}

  int status;
  std::string param;  // the request field at fault ("" when none)
  std::string type;
  std::string code;   // "" means null

  static std::string default_type(int status);
};

// The JSON body of an error; `param` and `code` become null when empty.
std::string error_body(int status, const std::string& message, const std::string& type, const std::string& param = {},
                       const std::string& code = {});
inline std::string error_body(const ApiError& e) { return error_body(e.status, e.what(), e.type, e.param, e.code); }

}  // namespace kestrel::server
