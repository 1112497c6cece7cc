#include "server/http_server.h"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>

#include <deque>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "base/error.h"
#include "base/log.h"
#include "server/api_error.h"
#include "server/sse.h"

namespace kestrel::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

std::string_view HttpRequest::header(http::field name) const {
  const auto it = headers.find(name);
  return it == headers.end() ? std::string_view() : std::string_view(it->value().data(), it->value().size());
}

namespace {

// Past this many unread bytes a connection stops reading while its request is answered (pipelining is rare).
constexpr size_t kMaxBufferedWhileAnswering = 64 * 1024;

class Connection : public std::enable_shared_from_this<Connection> {
public:
  Connection(tcp::socket socket, const HttpOptions& options, const HttpHandler& handler, std::atomic<int>& count)
      : socket_(std::move(socket)),
        read_timer_(socket_.get_executor()),
        write_timer_(socket_.get_executor()),
        options_(options),
        handler_(handler),
        count_(count) {
    ++count_;
  }
  ~Connection() { --count_; }

  void start() {
    net::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  void respond(uint64_t seq, int status, std::string_view content_type, std::string body,
               const std::vector<std::pair<std::string, std::string>>& headers) {
    if (!current(seq) || started_) return;
    std::string head = status_line(status);
    head += fmt::format("Content-Type: {}\r\nContent-Length: {}\r\n", content_type, body.size());
    for (const auto& [name, value] : headers) head += fmt::format("{}: {}\r\n", name, value);
    if (!keep_alive_) head += "Connection: close\r\n";
    head += "\r\n";
    started_ = complete_ = true;
    enqueue(std::move(head) + body);
  }
  void start_stream(uint64_t seq, std::string_view content_type) {
    if (!current(seq) || started_) return;
    std::string head = status_line(200);
    head += fmt::format("Content-Type: {}\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n", content_type);
    if (!keep_alive_) head += "Connection: close\r\n";
    head += "\r\n";
    started_ = true;
    enqueue(std::move(head));
  }
  void send(uint64_t seq, std::string data) {
    if (!current(seq) || !started_ || complete_ || data.empty()) return;
    enqueue(http_chunk(data));
  }
  void end_stream(uint64_t seq) {
    if (!current(seq) || !started_ || complete_) return;
    complete_ = true;
    enqueue(http_last_chunk());
  }
  void on_disconnect(uint64_t seq, std::function<void()> callback) {
    if (current(seq)) {
      on_disconnect_ = std::move(callback);
    } else if (callback) {
      callback();  // already gone
    }
  }
  net::any_io_executor executor() { return socket_.get_executor(); }

private:
  bool current(uint64_t seq) const { return !closed_ && answering_ && seq == seq_; }

  static std::string status_line(int status) {
    const auto reason = http::obsolete_reason(static_cast<http::status>(status));
    return fmt::format("HTTP/1.1 {} {}\r\nServer: kestrel\r\n", status, std::string_view(reason.data(), reason.size()));
  }

  void read_request() {
    if (closed_) return;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(options_.max_header_bytes));
    parser_->body_limit(options_.max_body_bytes);
    timed_out_ = false;
    read_timer_.expires_after(options_.read_timeout);
    read_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec) return;
      self->timed_out_ = true;
      error_code ignored;
      self->socket_.cancel(ignored);
    });
    http::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      self->on_read(ec);
    });
  }

  void on_read(error_code ec) {
    read_timer_.cancel();
    if (closed_) return;
    if (timed_out_) {
      if (parser_->got_some()) return fail_request(408, "timed out reading the request");
      return close();
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
        ec == net::error::operation_aborted) {
      return close();
    }
    if (ec == http::error::body_limit) {
      return fail_request(413, fmt::format("request body larger than {} bytes", options_.max_body_bytes));
    }
    if (ec == http::error::header_limit) return fail_request(431, "request headers too large");
    if (ec) {
      if (ec.category() == http::make_error_code(http::error::bad_method).category() || ec == http::error::partial_message) {
        return fail_request(400, fmt::format("malformed HTTP request: {}", ec.message()));
      }
      return close();
    }
    auto message = parser_->release();
    HttpRequest request;
    request.method = message.method();
    request.method_name = std::string(message.method_string());
    request.target = std::string(message.target());
    request.body = std::move(message.body());
    keep_alive_ = message.keep_alive();
    request.headers = std::move(message.base());
    begin_answer();
    watch();
    handler_(request, make_exchange());
  }

  void begin_answer() {
    ++seq_;
    answering_ = true;
    started_ = complete_ = false;
  }

  // An error the transport answers itself; the connection closes after it.
  void fail_request(int status, const std::string& message) {
    keep_alive_ = false;
    begin_answer();
    respond(seq_, status, "application/json", error_body(status, message, ApiError::default_type(status)), {});
  }

  std::shared_ptr<Exchange> make_exchange();

  // Reads while the answer is produced: end of stream or an error means the client is gone.
  void watch() {
    if (watching_ || closed_ || buffer_.size() > kMaxBufferedWhileAnswering) return;
    watching_ = true;
    socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](error_code ec, size_t n) {
      self->watching_ = false;
      if (!ec) {
        self->buffer_.commit(n);
        if (self->answering_) return self->watch();
      }
      if (self->closed_) return;
      if (ec && ec != net::error::operation_aborted) return self->client_gone();
      if (!self->answering_ && self->read_next_) {
        self->read_next_ = false;
        self->read_request();
      }
    });
  }

  void enqueue(std::string bytes) {
    pending_ += bytes;
    if (!writing_) write();
  }

  void write() {
    writing_ = true;
    out_ = std::move(pending_);
    pending_.clear();
    write_timer_.expires_after(options_.write_timeout);
    write_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec) self->client_gone();
    });
    net::async_write(socket_, net::buffer(out_), [self = shared_from_this()](error_code ec, size_t) {
      self->write_timer_.cancel();
      self->writing_ = false;
      if (self->closed_) return;
      if (ec) return self->client_gone();
      if (!self->pending_.empty()) return self->write();
      if (self->complete_) self->finish_answer();
    });
  }

  void finish_answer() {
    answering_ = false;
    on_disconnect_ = nullptr;
    if (!keep_alive_) {
      error_code ignored;
      socket_.shutdown(tcp::socket::shutdown_send, ignored);
      return close();
    }
    if (watching_) {
      read_next_ = true;  // the watch read's handler continues
      error_code ignored;
      socket_.cancel(ignored);
    } else {
      read_request();
    }
  }

  void client_gone() {
    if (closed_) return;
    auto callback = std::move(on_disconnect_);
    on_disconnect_ = nullptr;
    close();
    if (callback) callback();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    read_timer_.cancel();
    write_timer_.cancel();
  }

  tcp::socket socket_;
  net::steady_timer read_timer_, write_timer_;
  const HttpOptions& options_;
  const HttpHandler& handler_;
  std::atomic<int>& count_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  uint64_t seq_ = 0;
  bool answering_ = false, started_ = false, complete_ = false, keep_alive_ = true;
  bool watching_ = false, read_next_ = false, writing_ = false, closed_ = false, timed_out_ = false;
  std::string pending_, out_;
  std::function<void()> on_disconnect_;
};

class ConnectionExchange final : public Exchange {
public:
  ConnectionExchange(std::weak_ptr<Connection> connection, uint64_t seq, net::any_io_executor executor)
      : connection_(std::move(connection)), seq_(seq), executor_(std::move(executor)) {}

  void respond(int status, std::string_view content_type, std::string body,
               const std::vector<std::pair<std::string, std::string>>& headers) override {
    if (auto c = connection_.lock()) c->respond(seq_, status, content_type, std::move(body), headers);
  }
  void start_stream(std::string_view content_type) override {
    if (auto c = connection_.lock()) c->start_stream(seq_, content_type);
  }
  void send(std::string data) override {
    if (auto c = connection_.lock()) c->send(seq_, std::move(data));
  }
  void end_stream() override {
    if (auto c = connection_.lock()) c->end_stream(seq_);
  }
  void on_disconnect(std::function<void()> callback) override {
    if (auto c = connection_.lock()) {
      c->on_disconnect(seq_, std::move(callback));
    } else if (callback) {
      callback();
    }
  }
  net::any_io_executor executor() override { return executor_; }

private:
  std::weak_ptr<Connection> connection_;
  uint64_t seq_;
  net::any_io_executor executor_;
};

std::shared_ptr<Exchange> Connection::make_exchange() {
  return std::make_shared<ConnectionExchange>(weak_from_this(), seq_, socket_.get_executor());
}

}  // namespace

HttpServer::HttpServer(HttpOptions options, HttpHandler handler)
    : options_(std::move(options)), handler_(std::move(handler)), acceptor_(io_) {
  error_code ec;
  const auto address = net::ip::make_address(options_.host, ec);
  require(!ec, "--host '{}' is not an IP address", options_.host);
  const tcp::endpoint endpoint(address, options_.port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  require(!ec, "cannot listen on {}:{}: {}", options_.host, options_.port, ec.message());
  port_ = acceptor_.local_endpoint().port();
  accept();
}

HttpServer::~HttpServer() = default;

void HttpServer::accept() {
  acceptor_.async_accept(net::make_strand(io_), [this](error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Connection>(std::move(socket), options_, handler_, open_connections_)->start();
    }
    accept();
  });
}

void HttpServer::run() {
  std::vector<std::thread> threads;
  for (int i = 1; i < options_.threads; ++i) threads.emplace_back([this] { io_.run(); });
  io_.run();
  for (auto& t : threads) t.join();
}

void HttpServer::stop_accepting() {
  net::post(io_, [this] {
    error_code ignored;
    acceptor_.close(ignored);
  });
}

void HttpServer::stop() { io_.stop(); }

}  // namespace kestrel::server
