// The platform's /v1 API from the browser: the key travels only as a bearer header.

export class ApiError extends Error {
  constructor(status, body, fallback) {
    const error = (body && body.error) || {};
    super(error.message || fallback || `The platform answered ${status}.`);
    this.status = status;
    this.param = error.param || null;
    this.code = error.code || null;
    this.type = error.type || null;
  }

  /** 404 for a route the platform does not have (a feature not deployed), not a record. */
  get isMissingRoute() {
    return this.status === 404 && /^No route /.test(this.message);
  }
}

async function readBody(response) {
  const text = await response.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return { error: { message: text.slice(0, 300) } };
  }
}

function describeNetworkError(error) {
  return `Cannot reach the platform (${error.message}). Is 'ebb up' still running?`;
}

/**
 * createApi(key, {onUnauthorized}) -> {get, post, patch, put, del, streamChat}.
 * onUnauthorized(error) runs when the platform refuses the key (revoked mid-session).
 */
export function createApi(key, { onUnauthorized } = {}) {
  function headers(json) {
    const result = { Authorization: `Bearer ${key}` };
    if (json) result["Content-Type"] = "application/json";
    return result;
  }

  async function send(method, path, body, signal) {
    let response;
    try {
      response = await fetch(path, {
        method,
        headers: headers(body !== undefined),
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
        signal,
      });
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new ApiError(0, null, describeNetworkError(error));
    }
    return response;
  }

  async function request(method, path, { body, signal } = {}) {
    const response = await send(method, path, body, signal);
    const data = await readBody(response);
    if (!response.ok) {
      const error = new ApiError(response.status, data);
      if (response.status === 401 && onUnauthorized) onUnauthorized(error);
      throw error;
    }
    return data;
  }

  /**
   * POST /v1/chat/completions with stream: true. Yields {requestId} first, then each
   * chunk object; an error event inside the stream is thrown as an ApiError.
   */
  async function* streamChat(body, signal) {
    const response = await send("POST", "/v1/chat/completions", { ...body, stream: true }, signal);
    if (!response.ok) {
      const error = new ApiError(response.status, await readBody(response));
      error.retryAfterS = Number(response.headers.get("Retry-After")) || null;
      if (response.status === 401 && onUnauthorized) onUnauthorized(error);
      throw error;
    }
    yield { requestId: response.headers.get("X-Request-Id") };
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") return;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new ApiError(response.status, chunk);
          yield chunk;
        }
      }
    }
  }

  return {
    get: (path, options) => request("GET", path, options),
    post: (path, body, options) => request("POST", path, { ...options, body }),
    patch: (path, body, options) => request("PATCH", path, { ...options, body }),
    put: (path, body, options) => request("PUT", path, { ...options, body }),
    del: (path, options) => request("DELETE", path, options),
    streamChat,
  };
}

/**
 * The API's OpenAPI document: tells which optional fields exist. The key goes along, as
 * the platform serves it to the admin key only unless its API docs are public.
 */
export async function fetchSchema(key) {
  try {
    const headers = key ? { Authorization: `Bearer ${key}` } : {};
    const response = await fetch("/openapi.json", { cache: "no-store", headers });
    return response.ok ? await response.json() : null;
  } catch {
    return null;
  }
}
