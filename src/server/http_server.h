// The HTTP/1.1 transport (Boost.Beast over Asio): accepts connections, reads one request at a time with a header
// size limit, a body size limit (413) and a read deadline (408 for a slow client), and hands each request to the
// application with an Exchange to answer on. Answers are either one complete response or a chunked stream (SSE).
// While a request is being answered, the connection keeps reading, so a client that goes away is noticed at once
// and the Exchange's disconnect callback fires (the application cancels its engine request there).
// Every connection runs on its own strand; the application must call its Exchange on exchange->executor().
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/verb.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kestrel::server {

struct HttpRequest {
  boost::beast::http::verb method = boost::beast::http::verb::unknown;
  std::string method_name;
  std::string target;  // path and query as sent
  boost::beast::http::fields headers;
  std::string body;

  std::string_view path() const { return std::string_view(target).substr(0, target.find('?')); }
  std::string_view header(boost::beast::http::field name) const;
};

// One request's answer. Calls for a request whose connection moved on (or closed) are ignored.
class Exchange {
public:
  virtual ~Exchange() = default;
  virtual void respond(int status, std::string_view content_type, std::string body,
                       const std::vector<std::pair<std::string, std::string>>& headers = {}) = 0;
  // A 200 with a chunked body of `content_type`; then send() each piece and end().
  virtual void start_stream(std::string_view content_type) = 0;
  virtual void send(std::string data) = 0;
  virtual void end_stream() = 0;
  // Called once if the client goes away before the answer is complete.
  virtual void on_disconnect(std::function<void()> callback) = 0;
  virtual boost::asio::any_io_executor executor() = 0;
};

using HttpHandler = std::function<void(HttpRequest&, std::shared_ptr<Exchange>)>;

struct HttpOptions {
  std::string host = "0.0.0.0";
  uint16_t port = 8888;
  size_t max_header_bytes = 16 * 1024;
  size_t max_body_bytes = 16 * 1024 * 1024;
  std::chrono::milliseconds read_timeout{30000};   // to read one request, idle time before it included
  std::chrono::milliseconds write_timeout{60000};  // for one write to make progress
  int threads = 2;
};

class HttpServer {
public:
  // Binds and listens (throws Error when the address cannot be bound).
  HttpServer(HttpOptions options, HttpHandler handler);
  ~HttpServer();

  uint16_t port() const { return port_; }
  boost::asio::io_context& io() { return io_; }
  // Runs the event loop on options.threads threads; returns after stop().
  void run();
  // Closes the listening socket: no new connections.
  void stop_accepting();
  void stop();
  int open_connections() const { return open_connections_.load(); }

private:
  void accept();

  HttpOptions options_;
  HttpHandler handler_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::atomic<int> open_connections_{0};
};

}  // namespace kestrel::server
