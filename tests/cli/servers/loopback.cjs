// Preloaded into npm test servers (NODE_OPTIONS=--require): a listen() given only a port binds 127.0.0.1,
// so a server that would listen on every interface stays on loopback during tests.
"use strict";
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const port = args[0];
  const isPort = typeof port === "number" || (typeof port === "string" && /^\d+$/.test(port));
  if (isPort && typeof args[1] !== "string") {
    args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
