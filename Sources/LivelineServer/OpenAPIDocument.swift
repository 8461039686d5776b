/// The OpenAPI 3.1 description of Liveline's HTTP API, served at `/openapi.json`.
enum OpenAPIDocument {
    static let json = #"""
    {
      "openapi": "3.1.0",
      "info": {
        "title": "Liveline",
        "version": "0.1.0",
        "summary": "A self-hosted server for iOS Live Activities and Android live updates.",
        "description": "Liveline keeps track of Live Activities and the devices watching them, and pushes updates to them. The app on the phone registers each instance's push token with its publishable key (`pk_…`); the backend updates and ends activities with its secret key (`sk_…`); the operator manages apps with the admin token. All request and response bodies are JSON. Request bodies must be JSON objects of at most 64 KiB; unknown fields are refused (400 `unknown_field`). Dates are accepted as ISO-8601 strings or seconds since 1970 and returned as ISO-8601 UTC strings. Every error has the shape `{\"error\": {\"code\", \"message\", \"field\"}}`; an unknown route answers 404 `not_found` and a known route with the wrong method 405 `method_not_allowed`. iOS instances are pushed through APNs; Android instances (`platform: android`) through FCM HTTP v1 as high-priority data-only messages whose `data` keys are described by the `FCMLiveUpdateData` schema (and docs/android.md). An update, start or end whose APNs payload or FCM data would be over 4096 bytes is refused with 422 `payload_too_large` when the call arrives.",
        "license": {
          "name": "Apache-2.0",
          "identifier": "Apache-2.0"
        }
      },
      "servers": [
        {
          "url": "http://127.0.0.1:8080",
          "description": "A local Liveline server."
        }
      ],
      "tags": [
        {
          "name": "Activities",
          "description": "The backend updates, ends and reads activities (secret key)."
        },
        {
          "name": "Instances",
          "description": "Devices register and report on their Live Activities (publishable or secret key)."
        },
        {
          "name": "App",
          "description": "The backend reads its app and the health of its push credentials (secret key)."
        },
        {
          "name": "Admin",
          "description": "The operator manages apps and keys (admin token)."
        },
        {
          "name": "Health",
          "description": "Liveness, readiness and this document (no authentication)."
        },
        {
          "name": "Schemas",
          "description": "Content-state contracts per attributes type."
        }
      ],
      "security": [
        {
          "secretKey": []
        }
      ],
      "paths": {
        "/v1/activities/{activityId}/instances/{deviceId}": {
          "parameters": [
            {
              "$ref": "#/components/parameters/ActivityId"
            },
            {
              "$ref": "#/components/parameters/DeviceId"
            }
          ],
          "put": {
            "operationId": "registerInstance",
            "tags": [
              "Instances"
            ],
            "summary": "Register or refresh a device's push token for an activity.",
            "description": "Called by the app on the phone (publishable key) or by the backend. Creates the activity on first sight. Idempotent: registering again with the same values changes nothing and returns 200; a new instance returns 201; a new token, platform or user id updates the instance and returns 200. A new token makes an `invalidated` instance active again, but a `dismissed` instance is never brought back. `attributesType` and `attributes` are kept from the first registration that carries them. Refused with 409 once the activity has ended.",
            "security": [
              {
                "publishableKey": []
              },
              {
                "secretKey": []
              }
            ],
            "requestBody": {
              "description": "The device's push token and, on first registration, the activity's attributes.",
              "required": true,
              "content": {
                "application/json": {
                  "schema": {
                    "$ref": "#/components/schemas/RegisterInstanceRequest"
                  }
                }
              }
            },
            "responses": {
              "200": {
                "description": "The instance existed; it is returned as it is now (changed or not).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Instance"
                    }
                  }
                }
              },
              "201": {
                "description": "A new instance.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Instance"
                    }
                  }
                }
              },
              "400": {
                "$ref": "#/components/responses/BadRequest"
              },
              "401": {
                "$ref": "#/components/responses/Unauthorized"
              },
              "409": {
                "$ref": "#/components/responses/ActivityEnded"
              },
              "413": {
                "$ref": "#/components/responses/BodyTooLarge"
              },
              "422": {
                "description": "A semantic rule was broken (HTTP 422). `error.code` is one of: `invalid_id`, `invalid_platform`, `invalid_push_token`, `invalid_attributes_type`, `invalid_attributes`, `schema_mismatch` (the attributes type's schema is not met; `field` names the offending field).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/v1/activities/{activityId}/instances/{deviceId}/events": {
          "parameters": [
            {
              "$ref": "#/components/parameters/ActivityId"
            },
            {
              "$ref": "#/components/parameters/DeviceId"
            }
          ],
          "post": {
            "operationId": "reportInstanceEvent",
            "tags": [
              "Instances"
            ],
            "summary": "Report what happened to the Live Activity on a device.",
            "description": "Called by the app on the phone (publishable key) or by the backend. `dismissed`: the user removed the Live Activity; the instance stops receiving pushes and is never brought back. `ended`: the Live Activity ended on the device; it stays ended. `frequentPushes` (with `enabled`): the user's \"frequent updates\" setting. Returns the instance as it is now.",
            "security": [
              {
                "publishableKey": []
              },
              {
                "secretKey": []
              }
            ],
            "requestBody": {
              "description": "The event.",
              "required": true,
              "content": {
                "application/json": {
                  "schema": {
                    "$ref": "#/components/schemas/InstanceEventRequest"
                  },
                  "example": {
                    "type": "dismissed"
                  }
                }
              }
            },
            "responses": {
              "200": {
                "description": "The instance after the event.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Instance"
                    }
                  }
                }
              },
              "400": {
                "$ref": "#/components/responses/BadRequest"
              },
              "401": {
                "$ref": "#/components/responses/Unauthorized"
              },
              "404": {
                "$ref": "#/components/responses/InstanceNotFound"
              },
              "413": {
                "$ref": "#/components/responses/BodyTooLarge"
              },
              "422": {
                "description": "A semantic rule was broken (HTTP 422). `error.code` is one of: `invalid_id`, `invalid_event_type`.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/v1/activities/{activityId}/updates": {
          "parameters": [
            {
              "$ref": "#/components/parameters/ActivityId"
            }
          ],
          "post": {
            "operationId": "updateActivity",
            "tags": [
              "Activities"
            ],
            "summary": "Send a new content state to every instance of an activity.",
            "description": "Accepts the update as the activity's next sequence and answers 202 once it is committed durably; Liveline then delivers it to the activity's active instances. Creates the activity on first sight. The resulting APNs payload must be at most 4096 bytes (422 `payload_too_large`). Updates after the end are refused with 409 `activity_ended`. `dismissalDate` belongs to ending (422 `dismissal_date_not_allowed`).",
            "security": [
              {
                "secretKey": []
              }
            ],
            "requestBody": {
              "description": "The new content state and how to present it.",
              "required": true,
              "content": {
                "application/json": {
                  "schema": {
                    "$ref": "#/components/schemas/UpdateRequest"
                  }
                }
              }
            },
            "responses": {
              "202": {
                "description": "Accepted and committed durably as the activity's next sequence.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/AcceptedSequence"
                    }
                  }
                }
              },
              "400": {
                "$ref": "#/components/responses/BadRequest"
              },
              "401": {
                "$ref": "#/components/responses/Unauthorized"
              },
              "403": {
                "$ref": "#/components/responses/SecretKeyRequired"
              },
              "409": {
                "$ref": "#/components/responses/ActivityEnded"
              },
              "413": {
                "$ref": "#/components/responses/BodyTooLarge"
              },
              "422": {
                "description": "A semantic rule was broken (HTTP 422). `error.code` is one of: `invalid_id`, `invalid_content_state`, `invalid_date`, `invalid_relevance_score`, `invalid_priority`, `dismissal_date_not_allowed`, `invalid_min_update_interval`, `payload_too_large`, `schema_mismatch` (the attributes type's schema is not met; `field` names the offending field). `payload_too_large` covers both the APNs payload and the FCM data (4096 bytes each).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/v1/activities/{activityId}/end": {
          "parameters": [
            {
              "$ref": "#/components/parameters/ActivityId"
            }
          ],
          "post": {
            "operationId": "endActivity",
            "tags": [
              "Activities"
            ],
            "summary": "End an activity with an optional final content state.",
            "description": "Accepts the end as the activity's last sequence and answers 202 once it is committed durably; Liveline then delivers it to the instances. The body may be empty. Without `contentState` the current content state is the final one (422 `content_state_required` if there is none yet). `dismissalDate` is only allowed here and at most four hours from now (422 `invalid_dismissal_date`). The APNs payload must be at most 4096 bytes. An activity ends once: ending again, or updating afterwards, is refused with 409 `activity_ended`.",
            "security": [
              {
                "secretKey": []
              }
            ],
            "requestBody": {
              "description": "The final content state and presentation; may be empty.",
              "required": false,
              "content": {
                "application/json": {
                  "schema": {
                    "$ref": "#/components/schemas/EndRequest"
                  }
                }
              }
            },
            "responses": {
              "202": {
                "description": "Accepted and committed durably as the activity's last sequence.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/AcceptedSequence"
                    },
                    "example": {
                      "activityId": "match-4711",
                      "sequence": 4,
                      "event": "end",
                      "acceptedAt": "2026-11-21T11:50:00Z"
                    }
                  }
                }
              },
              "400": {
                "$ref": "#/components/responses/BadRequest"
              },
              "401": {
                "$ref": "#/components/responses/Unauthorized"
              },
              "403": {
                "$ref": "#/components/responses/SecretKeyRequired"
              },
              "404": {
                "$ref": "#/components/responses/ActivityNotFound"
              },
              "409": {
                "$ref": "#/components/responses/ActivityEnded"
              },
              "413": {
                "$ref": "#/components/responses/BodyTooLarge"
              },
              "422": {
                "description": "A semantic rule was broken (HTTP 422). `error.code` is one of: `invalid_id`, `invalid_content_state`, `content_state_required`, `invalid_date`, `invalid_dismissal_date`, `invalid_relevance_score`, `invalid_priority`, `payload_too_large`, `schema_mismatch` (the attributes type's schema is not met; `field` names the offending field). `payload_too_large` covers both the APNs payload and the FCM data (4096 bytes each).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/v1/activities/{activityId}": {
          "parameters": [
            {
              "$ref": "#/components/parameters/ActivityId"
            }
          ],
          "get": {
            "operationId": "getActivity",
            "tags": [
              "Activities"
            ],
            "summary": "Get one activity with its latest sequence and instance counts.",
            "description": "Dates are ISO-8601 UTC strings.",
            "security": [
              {
                "secretKey": []
              }
            ],
            "responses": {
              "200": {
                "description": "The activity.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/ActivityWithBudget"
                    }
                  }
                }
              },
              "401": {
                "$ref": "#/components/responses/Unauthorized"
              },
              "403": {
                "$ref": "#/components/responses/SecretKeyRequired"
              },
              "404": {
                "$ref": "#/components/responses/ActivityNotFound"
              },
              "422": {
                "description": "A semantic rule was broken (HTTP 422). `error.code` is one of: `invalid_id`.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          },
          "delete": {
            "operationId": "endAndDismissActivity",
            "tags": [
              "Activities"
            ],
            "summary": "End an activity and remove it from the Lock Screen at once.",
            "description": "The same as ending with the current content state and `dismissalDate` set to now; answers 202 once the end is committed durably. The activity stays readable with GET. 404 if the activity does not exist, 409 if it has already ended, 422 `content_state_required` if it never had a content state (end it with POST `/v1/activities/{activityId}/end` and a final `contentState` instead).",
            "security": [
              {
                "secretKey": []
              }
            ],
            "responses": {
              "202": {
                "description": "Accepted and committed durably as the activity's last sequence.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/AcceptedSequence"
                    }
                  }
                }
              },
              "401": {
                "$ref": "#/components/responses/Unauthorized"
              },
              "403": {
                "$ref": "#/components/responses/SecretKeyRequired"
              },
              "404": {
                "$ref": "#/components/responses/ActivityNotFound"
              },
              "409": {
                "$ref": "#/components/responses/ActivityEnded"
              },
              "422": {
                "description": "A semantic rule was broken (HTTP 422). `error.code` is one of: `invalid_id`, `content_state_required`, `payload_too_large`.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/v1/activities": {
          "get": {
            "operationId": "listActivities",
            "tags": [
              "Activities"
            ],
            "summary": "List the app's activities, ordered by activity id.",
            "description": "Keyset-paginated: pass `nextCursor` back as `cursor` until it is `null`.",
            "security": [
              {
                "secretKey": []
              }
            ],
            "parameters": [
              {
                "name": "state",
                "in": "query",
                "required": false,
                "description": "Only activities in this state. Anything else: 422 `invalid_state`.",
                "schema": {
                  "type": "string",
                  "enum": [
                    "active",
                    "ended"
                  ]
                }
              },
              {
                "name": "attributesType",
                "in": "query",
                "required": false,
                "description": "Only activities with this attributes type. An invalid name: 422 `invalid_attributes_type`.",
                "schema": {
                  "$ref": "#/components/schemas/AttributesType"
                }
              },
              {
                "$ref": "#/components/parameters/Limit"
              },
              {
                "$ref": "#/components/parameters/Cursor"
              }
            ],
            "responses": {
              "200": {
                "description": "One page of activities.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/ActivityPage"
                    }
                  }
                }
              },
              "400": {
                "description": "The query is malformed (HTTP 400): `invalid_type` (limit is not an integer) or `invalid_cursor`.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "401": {
                "$ref": "#/components/responses/Unauthorized"
              },
              "403": {
                "$ref": "#/components/responses/SecretKeyRequired"
              },
              "422": {
                "description": "A semantic rule was broken (HTTP 422). `error.code` is one of: `invalid_state`, `invalid_attributes_type`, `invalid_limit`.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/v1/activities/{activityId}/instances": {
          "parameters": [
            {
              "$ref": "#/components/parameters/ActivityId"
            }
          ],
          "get": {
            "operationId": "listInstances",
            "tags": [
              "Instances"
            ],
            "summary": "List the instances of an activity, ordered by device id.",
            "description": "Keyset-paginated: pass `nextCursor` back as `cursor` until it is `null`.",
            "security": [
              {
                "secretKey": []
              }
            ],
            "parameters": [
              {
                "$ref": "#/components/parameters/Limit"
              },
              {
                "$ref": "#/components/parameters/Cursor"
              }
            ],
            "responses": {
              "200": {
                "description": "One page of instances.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/InstancePage"
                    }
                  }
                }
              },
              "400": {
                "description": "The query is malformed (HTTP 400): `invalid_type` (limit is not an integer) or `invalid_cursor`.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "401": {
                "$ref": "#/components/responses/Unauthorized"
              },
              "403": {
                "$ref": "#/components/responses/SecretKeyRequired"
              },
              "404": {
                "$ref": "#/components/responses/ActivityNotFound"
              },
              "422": {
                "description": "A semantic rule was broken (HTTP 422). `error.code` is one of: `invalid_id`, `invalid_limit`.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/v1/activities/{activityId}/deliveries": {
          "parameters": [
            {
              "$ref": "#/components/parameters/ActivityId"
            }
          ],
          "get": {
            "operationId": "listDeliveries",
            "tags": [
              "Activities"
            ],
            "summary": "List an activity's delivery timeline, newest attempt first.",
            "description": "One entry per push attempt: which device and sequence, what the push service said (`status`, `reason`), the `apns-id` (`providerId`) and how long it took. The timeline is bounded: attempts older than 7 days are dropped, and at most the newest 10,000 attempts are kept per activity. Keyset-paginated: pass `nextCursor` back as `cursor` until it is `null`.",
            "security": [
              {
                "secretKey": []
              }
            ],
            "parameters": [
              {
                "$ref": "#/components/parameters/Limit"
              },
              {
                "$ref": "#/components/parameters/Cursor"
              }
            ],
            "responses": {
              "200": {
                "description": "One page of delivery attempts.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/DeliveryPage"
                    }
                  }
                }
              },
              "400": {
                "description": "The query is malformed (HTTP 400): `invalid_type` (limit is not an integer) or `invalid_cursor`.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "401": {
                "$ref": "#/components/responses/Unauthorized"
              },
              "403": {
                "$ref": "#/components/responses/SecretKeyRequired"
              },
              "404": {
                "$ref": "#/components/responses/ActivityNotFound"
              },
              "422": {
                "description": "A semantic rule was broken (HTTP 422). `error.code` is one of: `invalid_id`, `invalid_limit`.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/v1/app": {
          "get": {
            "operationId": "getApp",
            "tags": [
              "App"
            ],
            "summary": "Get the calling app and the health of its push credentials.",
            "description": "Shows whether APNs accepts the app's credentials: `healthy` turns `false` once APNs refused them twice, the second time with a freshly signed provider token (`InvalidProviderToken`, `ExpiredProviderToken`); those attempts show in the delivery timeline as `credentials_rejected`. The operator fixes them by setting credentials again (PUT `/admin/v1/apps/{appId}/credentials/apns`), which makes them healthy. The private key is never returned.",
            "security": [
              {
                "secretKey": []
              }
            ],
            "responses": {
              "200": {
                "description": "The app and its credentials.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/AppWithCredentials"
                    }
                  }
                }
              },
              "401": {
                "$ref": "#/components/responses/Unauthorized"
              },
              "403": {
                "$ref": "#/components/responses/SecretKeyRequired"
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/healthz": {
          "get": {
            "operationId": "getHealth",
            "tags": [
              "Health"
            ],
            "summary": "Liveness: the process answers.",
            "security": [],
            "responses": {
              "200": {
                "description": "The server is alive.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/HealthStatus"
                    },
                    "example": {
                      "status": "ok"
                    }
                  }
                }
              }
            }
          }
        },
        "/readyz": {
          "get": {
            "operationId": "getReadiness",
            "tags": [
              "Health"
            ],
            "summary": "Readiness: the database answers.",
            "security": [],
            "responses": {
              "200": {
                "description": "The server can handle requests.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/HealthStatus"
                    },
                    "example": {
                      "status": "ready"
                    }
                  }
                }
              },
              "503": {
                "description": "The database is not reachable (HTTP 503 `not_ready`).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    },
                    "examples": {
                      "not_ready": {
                        "value": {
                          "error": {
                            "code": "not_ready",
                            "message": "The database is not reachable.",
                            "field": null
                          }
                        }
                      }
                    }
                  }
                }
              }
            }
          }
        },
        "/openapi.json": {
          "get": {
            "operationId": "getOpenAPIDocument",
            "tags": [
              "Health"
            ],
            "summary": "This OpenAPI 3.1 document.",
            "security": [],
            "responses": {
              "200": {
                "description": "The OpenAPI document.",
                "content": {
                  "application/json": {
                    "schema": {
                      "type": "object"
                    }
                  }
                }
              }
            }
          }
        },
        "/admin/v1/apps": {
          "post": {
            "operationId": "createApp",
            "tags": [
              "Admin"
            ],
            "summary": "Create an app and issue its first secret and publishable keys.",
            "description": "The keys are in this response only: Liveline stores just their hashes.",
            "security": [
              {
                "adminToken": []
              }
            ],
            "requestBody": {
              "description": "The new app.",
              "required": true,
              "content": {
                "application/json": {
                  "schema": {
                    "$ref": "#/components/schemas/CreateAppRequest"
                  }
                }
              }
            },
            "responses": {
              "201": {
                "description": "The app and its keys.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/AppWithKeys"
                    }
                  }
                }
              },
              "400": {
                "$ref": "#/components/responses/BadRequest"
              },
              "401": {
                "$ref": "#/components/responses/AdminUnauthorized"
              },
              "403": {
                "$ref": "#/components/responses/AdminDisabled"
              },
              "409": {
                "description": "An app with this id exists (HTTP 409 `app_exists`); retry.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "413": {
                "$ref": "#/components/responses/BodyTooLarge"
              },
              "422": {
                "description": "A semantic rule was broken (HTTP 422). `error.code` is one of: `invalid_name`, `invalid_bundle_id`, `invalid_android_package`.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          },
          "get": {
            "operationId": "listApps",
            "tags": [
              "Admin"
            ],
            "summary": "List every app, oldest first.",
            "security": [
              {
                "adminToken": []
              }
            ],
            "responses": {
              "200": {
                "description": "Every app.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/AppList"
                    }
                  }
                }
              },
              "401": {
                "$ref": "#/components/responses/AdminUnauthorized"
              },
              "403": {
                "$ref": "#/components/responses/AdminDisabled"
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/admin/v1/apps/{appId}/keys/rotate": {
          "parameters": [
            {
              "$ref": "#/components/parameters/AppId"
            }
          ],
          "post": {
            "operationId": "rotateAppKeys",
            "tags": [
              "Admin"
            ],
            "summary": "Revoke the app's keys and issue a new secret and publishable key.",
            "description": "The old keys stop working at once. The new keys are in this response only.",
            "security": [
              {
                "adminToken": []
              }
            ],
            "responses": {
              "200": {
                "description": "The app and its new keys.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/AppWithKeys"
                    }
                  }
                }
              },
              "401": {
                "$ref": "#/components/responses/AdminUnauthorized"
              },
              "403": {
                "$ref": "#/components/responses/AdminDisabled"
              },
              "404": {
                "description": "No such app (HTTP 404 `app_not_found`).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    },
                    "examples": {
                      "app_not_found": {
                        "value": {
                          "error": {
                            "code": "app_not_found",
                            "message": "No such app.",
                            "field": "appId"
                          }
                        }
                      }
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/admin/v1/apps/{appId}/credentials/apns": {
          "parameters": [
            {
              "$ref": "#/components/parameters/AppId"
            }
          ],
          "put": {
            "operationId": "setAPNsCredentials",
            "tags": [
              "Admin"
            ],
            "summary": "Set (replace) an app's APNs credentials.",
            "description": "Token-auth credentials: the team id, the key id and the .p8 private key. The private key is sealed at rest with AES-GCM under the server's master key and never returned; the response shows only the non-secret settings. New credentials start out healthy. The body is validated before the app is looked up, so an invalid body answers 422 even for an unknown app.",
            "security": [
              {
                "adminToken": []
              }
            ],
            "requestBody": {
              "description": "The APNs credentials.",
              "required": true,
              "content": {
                "application/json": {
                  "schema": {
                    "$ref": "#/components/schemas/SetAPNsCredentialsRequest"
                  }
                }
              }
            },
            "responses": {
              "200": {
                "description": "The credentials as stored (without the private key).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Credentials"
                    }
                  }
                }
              },
              "400": {
                "$ref": "#/components/responses/BadRequest"
              },
              "401": {
                "$ref": "#/components/responses/AdminUnauthorized"
              },
              "403": {
                "$ref": "#/components/responses/AdminDisabled"
              },
              "404": {
                "description": "No such app (HTTP 404 `app_not_found`).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    },
                    "examples": {
                      "app_not_found": {
                        "value": {
                          "error": {
                            "code": "app_not_found",
                            "message": "No such app.",
                            "field": "appId"
                          }
                        }
                      }
                    }
                  }
                }
              },
              "413": {
                "$ref": "#/components/responses/BodyTooLarge"
              },
              "422": {
                "description": "A semantic rule was broken (HTTP 422). `error.code` is one of: `invalid_team_id`, `invalid_key_id`, `invalid_private_key`, `invalid_base_url`, `invalid_environment`.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/admin/v1/apps/{appId}/credentials": {
          "parameters": [
            {
              "$ref": "#/components/parameters/AppId"
            }
          ],
          "get": {
            "operationId": "listCredentials",
            "tags": [
              "Admin"
            ],
            "summary": "List an app's push credentials: settings and health, never the secret.",
            "security": [
              {
                "adminToken": []
              }
            ],
            "responses": {
              "200": {
                "description": "The app's credentials, one entry per provider that has some.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/CredentialsList"
                    }
                  }
                }
              },
              "401": {
                "$ref": "#/components/responses/AdminUnauthorized"
              },
              "403": {
                "$ref": "#/components/responses/AdminDisabled"
              },
              "404": {
                "description": "No such app (HTTP 404 `app_not_found`).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    },
                    "examples": {
                      "app_not_found": {
                        "value": {
                          "error": {
                            "code": "app_not_found",
                            "message": "No such app.",
                            "field": "appId"
                          }
                        }
                      }
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/v1/attributes-types/{attributesType}/schema": {
          "parameters": [
            {
              "name": "attributesType",
              "in": "path",
              "required": true,
              "description": "The Swift type name of the ActivityAttributes (letters, digits, `_`, `.`).",
              "schema": {
                "type": "string",
                "pattern": "^[A-Za-z0-9_.]{1,128}$"
              }
            }
          ],
          "put": {
            "operationId": "putAttributesTypeSchema",
            "tags": [
              "Schemas"
            ],
            "summary": "Register the content-state contract of an attributes type.",
            "description": "With a schema, an update or end whose `contentState` does not conform — and a registration whose `attributes` do not — is refused with 422 `schema_mismatch`, naming the field and the expectation (`contentState.minutesAway: expected integer, got string \"128\".`). Fields the schema does not name pass through (a `Codable` struct ignores them). ISO-8601 dates are encoded as `dateEncoding` says. Without a schema, Liveline remembers the kinds of the first accepted state's fields and reports later changes in the 202 response's `warnings`.",
            "security": [
              {
                "secretKey": []
              }
            ],
            "requestBody": {
              "required": true,
              "content": {
                "application/json": {
                  "schema": {
                    "$ref": "#/components/schemas/AttributesTypeSchemaInput"
                  }
                }
              }
            },
            "responses": {
              "200": {
                "description": "The schema replaced the earlier one.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/AttributesTypeSchema"
                    }
                  }
                }
              },
              "201": {
                "description": "The schema is registered.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/AttributesTypeSchema"
                    }
                  }
                }
              },
              "400": {
                "$ref": "#/components/responses/BadRequest"
              },
              "401": {
                "$ref": "#/components/responses/Unauthorized"
              },
              "403": {
                "$ref": "#/components/responses/SecretKeyRequired"
              },
              "413": {
                "$ref": "#/components/responses/BodyTooLarge"
              },
              "422": {
                "description": "The schema is not valid (`invalid_schema`, `unknown_field`, `missing_field`) or the name is not (`invalid_attributes_type`).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          },
          "get": {
            "operationId": "getAttributesTypeSchema",
            "tags": [
              "Schemas"
            ],
            "summary": "Read the schema registered for an attributes type.",
            "security": [
              {
                "secretKey": []
              }
            ],
            "responses": {
              "200": {
                "description": "The schema.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/AttributesTypeSchema"
                    }
                  }
                }
              },
              "401": {
                "$ref": "#/components/responses/Unauthorized"
              },
              "403": {
                "$ref": "#/components/responses/SecretKeyRequired"
              },
              "404": {
                "description": "No schema is registered for this attributes type (`schema_not_found`).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "422": {
                "description": "The name is not valid (`invalid_attributes_type`).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/admin/v1/apps/{appId}/credentials/fcm": {
          "parameters": [
            {
              "$ref": "#/components/parameters/AppId"
            }
          ],
          "put": {
            "operationId": "setFCMCredentials",
            "tags": [
              "Admin"
            ],
            "summary": "Set (replace) an app's FCM credentials.",
            "description": "The Firebase service account Liveline signs its RS256 OAuth assertions with. The JSON (with its private key) is sealed at rest with AES-GCM under the server's master key and never returned; the response shows only the non-secret settings. New credentials start out healthy. The body is validated before the app is looked up, so an invalid body answers 422 even for an unknown app.",
            "security": [
              {
                "adminToken": []
              }
            ],
            "requestBody": {
              "description": "The FCM credentials.",
              "required": true,
              "content": {
                "application/json": {
                  "schema": {
                    "$ref": "#/components/schemas/SetFCMCredentialsRequest"
                  }
                }
              }
            },
            "responses": {
              "200": {
                "description": "The credentials as stored (without the private key).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Credentials"
                    }
                  }
                }
              },
              "400": {
                "$ref": "#/components/responses/BadRequest"
              },
              "401": {
                "$ref": "#/components/responses/AdminUnauthorized"
              },
              "403": {
                "$ref": "#/components/responses/AdminDisabled"
              },
              "404": {
                "description": "No such app (HTTP 404 `app_not_found`).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    },
                    "examples": {
                      "app_not_found": {
                        "value": {
                          "error": {
                            "code": "app_not_found",
                            "message": "No such app.",
                            "field": "appId"
                          }
                        }
                      }
                    }
                  }
                }
              },
              "413": {
                "$ref": "#/components/responses/BodyTooLarge"
              },
              "422": {
                "description": "A semantic rule was broken (HTTP 422). `error.code` is one of: `invalid_service_account`, `invalid_base_url`, `invalid_ca_certificate`.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        },
        "/admin/v1/apps/{appId}/budget": {
          "parameters": [
            {
              "$ref": "#/components/parameters/AppId"
            }
          ],
          "put": {
            "operationId": "setAppBudget",
            "tags": [
              "Admin"
            ],
            "summary": "Set (or clear) an app's own priority-10 budget.",
            "description": "Apple throttles a Live Activity that gets too many priority-10 pushes in an hour and does not publish the figure. Liveline sends updates at priority 10 while an instance is within this budget and at 5 beyond it (alerts and ends always at 10). `null` parts fall back to the server's configuration.",
            "security": [
              {
                "adminToken": []
              }
            ],
            "requestBody": {
              "required": true,
              "content": {
                "application/json": {
                  "schema": {
                    "$ref": "#/components/schemas/SetBudgetRequest"
                  }
                }
              }
            },
            "responses": {
              "200": {
                "description": "The app, with its budget.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/App"
                    }
                  }
                }
              },
              "400": {
                "$ref": "#/components/responses/BadRequest"
              },
              "401": {
                "$ref": "#/components/responses/AdminUnauthorized"
              },
              "403": {
                "$ref": "#/components/responses/AdminDisabled"
              },
              "404": {
                "description": "No such app (HTTP 404 `app_not_found`).",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    },
                    "examples": {
                      "app_not_found": {
                        "value": {
                          "error": {
                            "code": "app_not_found",
                            "message": "No such app.",
                            "field": "appId"
                          }
                        }
                      }
                    }
                  }
                }
              },
              "413": {
                "$ref": "#/components/responses/BodyTooLarge"
              },
              "422": {
                "description": "A semantic rule was broken (HTTP 422). `error.code` is `invalid_budget`.",
                "content": {
                  "application/json": {
                    "schema": {
                      "$ref": "#/components/schemas/Error"
                    }
                  }
                }
              },
              "500": {
                "$ref": "#/components/responses/InternalError"
              }
            }
          }
        }
      },
      "components": {
        "schemas": {
          "Identifier": {
            "type": "string",
            "minLength": 1,
            "maxLength": 128,
            "pattern": "^[A-Za-z0-9._:-]{1,128}$",
            "description": "An id chosen by the app or backend (activity id, device id, user id): 1 to 128 characters of A-Z, a-z, 0-9, '.', '_', ':' or '-'.",
            "examples": [
              "match-4711"
            ]
          },
          "AttributesType": {
            "type": "string",
            "minLength": 1,
            "maxLength": 128,
            "pattern": "^[A-Za-z0-9_.]{1,128}$",
            "description": "The Swift type name of the activity's `ActivityAttributes` (letters, digits, '_' and '.').",
            "examples": [
              "MatchAttributes"
            ]
          },
          "DateInput": {
            "description": "A date as the API accepts it: an ISO-8601 date-time string (`2026-11-21T10:00:00Z`, optionally with fractional seconds or an offset) or a number of seconds since 1970 (fractions are truncated). Responses always give dates as ISO-8601 UTC strings.",
            "oneOf": [
              {
                "type": "string",
                "format": "date-time",
                "description": "An ISO-8601 date-time.",
                "examples": [
                  "2026-11-21T10:00:00Z"
                ]
              },
              {
                "type": "number",
                "minimum": 0,
                "exclusiveMaximum": 100000000000,
                "description": "Seconds since 1970-01-01T00:00:00Z.",
                "examples": [
                  1795255200
                ]
              }
            ]
          },
          "Error": {
            "type": "object",
            "description": "Every error the API answers with, whatever the status.",
            "required": [
              "error"
            ],
            "properties": {
              "error": {
                "type": "object",
                "required": [
                  "code",
                  "message",
                  "field"
                ],
                "properties": {
                  "code": {
                    "type": "string",
                    "description": "A stable, machine-readable code such as `activity_ended`.",
                    "examples": [
                      "activity_ended"
                    ]
                  },
                  "message": {
                    "type": "string",
                    "description": "A sentence for humans; may change between versions."
                  },
                  "field": {
                    "type": [
                      "string",
                      "null"
                    ],
                    "description": "The input at fault: a body JSON path (`contentState`, `alert.title`), a path parameter (`activityId`) or a query parameter (`limit`); `null` when no single input is at fault."
                  }
                }
              }
            },
            "example": {
              "error": {
                "code": "activity_ended",
                "message": "Activity 'match-4711' has ended; it takes no further updates.",
                "field": "activityId"
              }
            }
          },
          "Alert": {
            "type": "object",
            "description": "An alert that lights the screen and, on devices without a Dynamic Island, shows as a banner.",
            "additionalProperties": false,
            "required": [
              "title",
              "body"
            ],
            "properties": {
              "title": {
                "type": "string",
                "description": "The alert title."
              },
              "body": {
                "type": "string",
                "description": "The alert body."
              },
              "sound": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "A sound file name in the app bundle, or `default`. Omitted (or `null`) for no sound."
              }
            },
            "example": {
              "title": "Goal!",
              "body": "Home 2 - 1 Away",
              "sound": "default"
            }
          },
          "InstanceCounts": {
            "type": "object",
            "description": "How many instances of the activity are in each state.",
            "required": [
              "active",
              "dismissed",
              "ended",
              "invalidated",
              "total"
            ],
            "properties": {
              "active": {
                "type": "integer",
                "minimum": 0,
                "description": "Instances that receive pushes."
              },
              "dismissed": {
                "type": "integer",
                "minimum": 0,
                "description": "Instances the user removed; never brought back."
              },
              "ended": {
                "type": "integer",
                "minimum": 0,
                "description": "Instances whose Live Activity ended on the device."
              },
              "invalidated": {
                "type": "integer",
                "minimum": 0,
                "description": "Instances whose push token the push service rejected; a new token makes them active again."
              },
              "total": {
                "type": "integer",
                "minimum": 0,
                "description": "All instances."
              }
            }
          },
          "Activity": {
            "type": "object",
            "description": "One Live Activity of the app, as Liveline knows it: the latest accepted sequence and what it carries. Created on first sight, by the first instance registration or the first update.",
            "required": [
              "activityId",
              "state",
              "attributesType",
              "attributes",
              "contentState",
              "sequence",
              "lastEvent",
              "lastAcceptedAt",
              "alert",
              "staleDate",
              "relevanceScore",
              "priority",
              "dismissalDate",
              "instances",
              "createdAt",
              "updatedAt",
              "endedAt",
              "endReason",
              "minUpdateInterval"
            ],
            "properties": {
              "activityId": {
                "$ref": "#/components/schemas/Identifier"
              },
              "state": {
                "type": "string",
                "enum": [
                  "active",
                  "ended"
                ],
                "description": "`active` takes updates; `ended` refuses them."
              },
              "attributesType": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "The Swift type name of the attributes, from the first registration that carried one."
              },
              "attributes": {
                "type": [
                  "object",
                  "null"
                ],
                "description": "The static attributes, from the first registration that carried an attributesType.",
                "additionalProperties": true
              },
              "contentState": {
                "type": [
                  "object",
                  "null"
                ],
                "description": "The content state of the latest sequence; `null` before the first update.",
                "additionalProperties": true
              },
              "sequence": {
                "type": "integer",
                "minimum": 0,
                "description": "The number of the latest accepted update or end; 0 before the first."
              },
              "lastEvent": {
                "type": [
                  "string",
                  "null"
                ],
                "enum": [
                  "update",
                  "end",
                  null
                ],
                "description": "The event of the latest sequence; `null` before the first."
              },
              "lastAcceptedAt": {
                "type": [
                  "string",
                  "null"
                ],
                "format": "date-time",
                "description": "When the latest sequence was accepted (the push's `aps.timestamp`); `null` before the first."
              },
              "alert": {
                "anyOf": [
                  {
                    "$ref": "#/components/schemas/Alert"
                  },
                  {
                    "type": "null"
                  }
                ],
                "description": "The alert of the latest sequence, if it had one."
              },
              "staleDate": {
                "type": [
                  "string",
                  "null"
                ],
                "format": "date-time",
                "description": "When the system shows the activity as stale."
              },
              "relevanceScore": {
                "type": [
                  "number",
                  "null"
                ],
                "minimum": 0,
                "description": "The relative relevance among the app's activities."
              },
              "priority": {
                "type": [
                  "integer",
                  "null"
                ],
                "enum": [
                  5,
                  10,
                  null
                ],
                "description": "The APNs priority asked for the latest sequence; `null` lets Liveline choose."
              },
              "dismissalDate": {
                "type": [
                  "string",
                  "null"
                ],
                "format": "date-time",
                "description": "When the ended activity leaves the Lock Screen; only set by an end."
              },
              "instances": {
                "$ref": "#/components/schemas/InstanceCounts"
              },
              "createdAt": {
                "type": "string",
                "format": "date-time"
              },
              "updatedAt": {
                "type": "string",
                "format": "date-time"
              },
              "endedAt": {
                "type": [
                  "string",
                  "null"
                ],
                "format": "date-time",
                "description": "When the activity ended; `null` while active."
              },
              "endReason": {
                "type": [
                  "string",
                  "null"
                ],
                "enum": [
                  "caller",
                  "lifetime",
                  "all-instances-gone",
                  null
                ],
                "description": "Why the activity ended: `caller` (POST …/end or DELETE), `lifetime` (Liveline ended it before the platform's 8-hour limit, with its last state), `all-instances-gone` (every instance was dismissed, ended on the device or invalidated); `null` while active."
              },
              "minUpdateInterval": {
                "type": [
                  "number",
                  "null"
                ],
                "description": "Rate shaping: seconds that pass between two states sent to the phones; `null` when off."
              }
            }
          },
          "Instance": {
            "type": "object",
            "description": "One device watching one activity.",
            "required": [
              "activityId",
              "deviceId",
              "platform",
              "pushToken",
              "userId",
              "state",
              "frequentPushesEnabled",
              "deliveredSequence",
              "createdAt",
              "updatedAt"
            ],
            "properties": {
              "activityId": {
                "$ref": "#/components/schemas/Identifier"
              },
              "deviceId": {
                "$ref": "#/components/schemas/Identifier"
              },
              "platform": {
                "type": "string",
                "enum": [
                  "ios",
                  "android"
                ]
              },
              "pushToken": {
                "type": "string",
                "description": "The push token; iOS tokens are stored lowercased."
              },
              "userId": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "The backend's user id for this device, if the app sent one."
              },
              "state": {
                "type": "string",
                "enum": [
                  "active",
                  "dismissed",
                  "ended",
                  "invalidated"
                ],
                "description": "`active` receives pushes. `dismissed` is final: the user removed the Live Activity and nothing brings it back. `ended` stays ended (the user may still dismiss it). `invalidated` means the push service rejected the token; registering a new token makes it active again."
              },
              "frequentPushesEnabled": {
                "type": [
                  "boolean",
                  "null"
                ],
                "description": "What the app last reported for the user's \"frequent updates\" setting; `null` if never reported."
              },
              "deliveredSequence": {
                "type": "integer",
                "minimum": 0,
                "description": "The last sequence delivered to this instance; 0 before the first."
              },
              "createdAt": {
                "type": "string",
                "format": "date-time"
              },
              "updatedAt": {
                "type": "string",
                "format": "date-time"
              }
            }
          },
          "AcceptedSequence": {
            "type": "object",
            "description": "An update or end, committed durably as the activity's next sequence.",
            "required": [
              "activityId",
              "sequence",
              "event",
              "acceptedAt"
            ],
            "properties": {
              "activityId": {
                "$ref": "#/components/schemas/Identifier"
              },
              "sequence": {
                "type": "integer",
                "minimum": 1,
                "description": "The sequence number given to this update or end."
              },
              "event": {
                "type": "string",
                "enum": [
                  "update",
                  "end"
                ]
              },
              "acceptedAt": {
                "type": "string",
                "format": "date-time",
                "description": "When the sequence was accepted; becomes the push's `aps.timestamp`."
              },
              "warnings": {
                "type": "array",
                "description": "Present only when something looks wrong but was accepted: for an activity whose attributes type has no schema, fields whose JSON kind differs from earlier accepted states (`content_state_type_changed`). The phone's decoder would silently drop such a state.",
                "items": {
                  "type": "object",
                  "required": [
                    "code",
                    "field",
                    "message"
                  ],
                  "properties": {
                    "code": {
                      "type": "string",
                      "enum": [
                        "content_state_type_changed"
                      ]
                    },
                    "field": {
                      "type": "string",
                      "description": "The field's path, such as `contentState.minutesAway`."
                    },
                    "message": {
                      "type": "string"
                    }
                  }
                }
              }
            },
            "example": {
              "activityId": "match-4711",
              "sequence": 3,
              "event": "update",
              "acceptedAt": "2026-11-21T10:00:00Z"
            }
          },
          "RegisterInstanceRequest": {
            "type": "object",
            "description": "A device's push token for one activity. For optional fields, `null` is the same as leaving the field out.",
            "additionalProperties": false,
            "required": [
              "platform",
              "pushToken"
            ],
            "properties": {
              "platform": {
                "type": "string",
                "enum": [
                  "ios",
                  "android"
                ]
              },
              "pushToken": {
                "type": "string",
                "minLength": 1,
                "maxLength": 4096,
                "description": "iOS: the hexadecimal form of the ActivityKit push token (an even number of 0-9, a-f; stored lowercased). Android: the FCM registration token (printable ASCII without spaces)."
              },
              "attributesType": {
                "anyOf": [
                  {
                    "$ref": "#/components/schemas/AttributesType"
                  },
                  {
                    "type": "null"
                  }
                ],
                "description": "The Swift type name of the activity's attributes. Kept from the first registration that carries it."
              },
              "attributes": {
                "type": [
                  "object",
                  "null"
                ],
                "additionalProperties": true,
                "description": "The static attributes. Kept from the first registration that carries an attributesType."
              },
              "userId": {
                "anyOf": [
                  {
                    "$ref": "#/components/schemas/Identifier"
                  },
                  {
                    "type": "null"
                  }
                ],
                "description": "The backend's user id for this device."
              }
            },
            "example": {
              "platform": "ios",
              "pushToken": "80a1b2c3d4e5f60718293a4b5c6d7e8f",
              "attributesType": "MatchAttributes",
              "attributes": {
                "homeTeam": "Home",
                "awayTeam": "Away"
              },
              "userId": "user-42"
            }
          },
          "UpdateRequest": {
            "type": "object",
            "description": "A new content state. `dismissalDate` is refused here (422 `dismissal_date_not_allowed`): it belongs to ending. For optional fields, `null` is the same as leaving the field out.",
            "additionalProperties": false,
            "required": [
              "contentState"
            ],
            "properties": {
              "contentState": {
                "type": "object",
                "additionalProperties": true,
                "description": "A JSON object that decodes into the app's `ContentState`. The APNs payload it produces must be at most 4096 bytes."
              },
              "alert": {
                "anyOf": [
                  {
                    "$ref": "#/components/schemas/Alert"
                  },
                  {
                    "type": "null"
                  }
                ]
              },
              "staleDate": {
                "anyOf": [
                  {
                    "$ref": "#/components/schemas/DateInput"
                  },
                  {
                    "type": "null"
                  }
                ],
                "description": "When the system shows the activity as stale."
              },
              "relevanceScore": {
                "type": [
                  "number",
                  "null"
                ],
                "minimum": 0,
                "description": "The relative relevance among the app's activities."
              },
              "priority": {
                "type": [
                  "integer",
                  "null"
                ],
                "enum": [
                  5,
                  10,
                  null
                ],
                "description": "The APNs priority: 10 immediate, 5 power-considerate. Leave out to let Liveline choose."
              },
              "minUpdateInterval": {
                "type": [
                  "number",
                  "null"
                ],
                "minimum": 0,
                "maximum": 3600,
                "description": "Rate shaping for this activity from now on: states are sent to the phones at most once per this many seconds. Updates that arrive faster are coalesced — none is lost; the newest goes out at the next allowed moment, so the final state is always delivered — and an end goes at once. 0 turns shaping off; leaving it out keeps the current setting. With the hourly priority-10 budget of a Live Activity in mind, an interval of at least 3600 / budget seconds keeps every update eligible for priority 10."
              }
            },
            "example": {
              "contentState": {
                "homeScore": 2,
                "awayScore": 1,
                "minute": 67
              },
              "alert": {
                "title": "Goal!",
                "body": "Home 2 - 1 Away"
              },
              "staleDate": "2026-11-21T12:00:00Z",
              "priority": 10
            }
          },
          "EndRequest": {
            "type": "object",
            "description": "The end of an activity. Every field is optional and an empty body counts as `{}`; without `contentState` the current content state becomes the final one. For optional fields, `null` is the same as leaving the field out.",
            "additionalProperties": false,
            "properties": {
              "contentState": {
                "type": [
                  "object",
                  "null"
                ],
                "additionalProperties": true,
                "description": "The final content state; needed when the activity has none yet. The APNs payload must be at most 4096 bytes."
              },
              "alert": {
                "anyOf": [
                  {
                    "$ref": "#/components/schemas/Alert"
                  },
                  {
                    "type": "null"
                  }
                ]
              },
              "staleDate": {
                "anyOf": [
                  {
                    "$ref": "#/components/schemas/DateInput"
                  },
                  {
                    "type": "null"
                  }
                ]
              },
              "relevanceScore": {
                "type": [
                  "number",
                  "null"
                ],
                "minimum": 0
              },
              "priority": {
                "type": [
                  "integer",
                  "null"
                ],
                "enum": [
                  5,
                  10,
                  null
                ]
              },
              "dismissalDate": {
                "anyOf": [
                  {
                    "$ref": "#/components/schemas/DateInput"
                  },
                  {
                    "type": "null"
                  }
                ],
                "description": "When the ended Live Activity leaves the Lock Screen: at most four hours from now (the system removes it by then anyway). A date in the past removes it at once; leave out to let the system decide."
              }
            },
            "example": {
              "contentState": {
                "homeScore": 3,
                "awayScore": 1,
                "minute": 90
              },
              "dismissalDate": "2026-11-21T12:00:00Z"
            }
          },
          "InstanceStateEvent": {
            "type": "object",
            "description": "The Live Activity was dismissed by the user or ended on the device.",
            "additionalProperties": false,
            "required": [
              "type"
            ],
            "properties": {
              "type": {
                "type": "string",
                "enum": [
                  "dismissed",
                  "ended"
                ],
                "description": "`dismissed` is final: the instance is never brought back. `ended` keeps the instance ended (it may still be dismissed)."
              }
            }
          },
          "FrequentPushesEvent": {
            "type": "object",
            "description": "The user's \"frequent updates\" setting for the app, as ActivityKit reports it.",
            "additionalProperties": false,
            "required": [
              "type",
              "enabled"
            ],
            "properties": {
              "type": {
                "type": "string",
                "const": "frequentPushes"
              },
              "enabled": {
                "type": "boolean"
              }
            }
          },
          "InstanceEventRequest": {
            "description": "Something the device saw happen to its Live Activity. `enabled` is required for `frequentPushes` and refused (400 `unknown_field`) for the other types.",
            "oneOf": [
              {
                "$ref": "#/components/schemas/InstanceStateEvent"
              },
              {
                "$ref": "#/components/schemas/FrequentPushesEvent"
              }
            ],
            "discriminator": {
              "propertyName": "type",
              "mapping": {
                "dismissed": "#/components/schemas/InstanceStateEvent",
                "ended": "#/components/schemas/InstanceStateEvent",
                "frequentPushes": "#/components/schemas/FrequentPushesEvent"
              }
            }
          },
          "ActivityPage": {
            "type": "object",
            "description": "One page of activities, ordered by activity id.",
            "required": [
              "data",
              "nextCursor"
            ],
            "properties": {
              "data": {
                "type": "array",
                "items": {
                  "$ref": "#/components/schemas/Activity"
                }
              },
              "nextCursor": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "Pass as `cursor` to get the next page; `null` on the last page."
              }
            }
          },
          "InstancePage": {
            "type": "object",
            "description": "One page of instances, ordered by device id.",
            "required": [
              "data",
              "nextCursor"
            ],
            "properties": {
              "data": {
                "type": "array",
                "items": {
                  "$ref": "#/components/schemas/Instance"
                }
              },
              "nextCursor": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "Pass as `cursor` to get the next page; `null` on the last page."
              }
            }
          },
          "App": {
            "type": "object",
            "description": "An app: one iOS bundle id and optionally one Android package, with its own keys and data.",
            "required": [
              "id",
              "name",
              "bundleId",
              "androidPackage",
              "createdAt",
              "budget"
            ],
            "properties": {
              "id": {
                "type": "string",
                "description": "Liveline's id for the app (`app_…`).",
                "examples": [
                  "app_0123456789ABCDEFGHIJ"
                ]
              },
              "name": {
                "type": "string"
              },
              "bundleId": {
                "type": "string",
                "description": "The iOS bundle id; APNs topics derive from it."
              },
              "androidPackage": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "The Android application id, if the app ships on Android."
              },
              "createdAt": {
                "type": "string",
                "format": "date-time"
              },
              "budget": {
                "type": "object",
                "required": [
                  "hourly",
                  "hourlyWithFrequentPushes"
                ],
                "description": "The app's own hourly priority-10 budget per iOS instance; `null` parts use the server's configuration (`liveline.budget.hourly`, `liveline.budget.hourlyWithFrequentPushes`: 10 and 40 by default).",
                "properties": {
                  "hourly": {
                    "type": [
                      "integer",
                      "null"
                    ],
                    "minimum": 0,
                    "maximum": 3600
                  },
                  "hourlyWithFrequentPushes": {
                    "type": [
                      "integer",
                      "null"
                    ],
                    "minimum": 0,
                    "maximum": 3600
                  }
                }
              }
            }
          },
          "AppWithKeys": {
            "type": "object",
            "description": "An app with the keys just issued for it. The keys are shown this once: Liveline stores only their hashes.",
            "required": [
              "app",
              "secretKey",
              "publishableKey"
            ],
            "properties": {
              "app": {
                "$ref": "#/components/schemas/App"
              },
              "secretKey": {
                "type": "string",
                "pattern": "^sk_[0-9A-Za-z]{48}$",
                "description": "The backend's key. Keep it on the server."
              },
              "publishableKey": {
                "type": "string",
                "pattern": "^pk_[0-9A-Za-z]{48}$",
                "description": "The key the app ships with: it may only register instances and report instance events."
              }
            }
          },
          "AppList": {
            "type": "object",
            "description": "Every app, oldest first.",
            "required": [
              "data"
            ],
            "properties": {
              "data": {
                "type": "array",
                "items": {
                  "$ref": "#/components/schemas/App"
                }
              }
            }
          },
          "CreateAppRequest": {
            "type": "object",
            "description": "A new app. For `androidPackage`, `null` is the same as leaving it out.",
            "additionalProperties": false,
            "required": [
              "name",
              "bundleId"
            ],
            "properties": {
              "name": {
                "type": "string",
                "minLength": 1,
                "maxLength": 200,
                "description": "A human name: 1 to 200 printable characters (surrounding whitespace is trimmed)."
              },
              "bundleId": {
                "type": "string",
                "maxLength": 155,
                "pattern": "^[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+$",
                "description": "A reverse-DNS iOS bundle id such as `com.example.app`."
              },
              "androidPackage": {
                "type": [
                  "string",
                  "null"
                ],
                "maxLength": 255,
                "pattern": "^[A-Za-z][A-Za-z0-9_]*(\\.[A-Za-z][A-Za-z0-9_]*)+$",
                "description": "An Android application id such as `com.example.app`."
              }
            },
            "example": {
              "name": "Scores",
              "bundleId": "com.example.scores",
              "androidPackage": "com.example.scores"
            }
          },
          "Delivery": {
            "type": "object",
            "description": "One attempt to push one sequence to one instance. A push that is retried leaves one entry per attempt.",
            "required": [
              "id",
              "deviceId",
              "platform",
              "sequence",
              "event",
              "priority",
              "status",
              "providerId",
              "reason",
              "latencyMs",
              "attempt",
              "attemptedAt"
            ],
            "properties": {
              "id": {
                "type": "integer",
                "minimum": 1,
                "description": "The attempt's id, assigned by Liveline and increasing: the timeline is ordered by it."
              },
              "deviceId": {
                "$ref": "#/components/schemas/Identifier"
              },
              "platform": {
                "type": "string",
                "enum": [
                  "ios",
                  "android"
                ]
              },
              "sequence": {
                "type": "integer",
                "minimum": 1,
                "description": "The activity sequence this attempt pushed."
              },
              "event": {
                "type": "string",
                "enum": [
                  "update",
                  "end"
                ],
                "description": "The event of that sequence."
              },
              "priority": {
                "type": "integer",
                "enum": [
                  5,
                  10
                ],
                "description": "The APNs priority the push was sent with."
              },
              "status": {
                "type": "string",
                "enum": [
                  "delivered",
                  "retrying",
                  "invalidated",
                  "rejected",
                  "credentials_rejected"
                ],
                "description": "What the push service said. `delivered`: accepted. `retrying`: a failure that may pass (429, 5xx, a transport error); another attempt follows or the activity is tried again later. `invalidated`: the token is gone (410, `BadDeviceToken`, `DeviceTokenNotForTopic`); the instance is invalidated. `rejected`: refused for good (`PayloadTooLarge`, `BadTopic` …); not retried. `credentials_rejected`: the app's credentials were refused even after a fresh provider token."
              },
              "providerId": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "The `apns-id` of the push (the FCM message name on Android); `null` when the push service gave none, e.g. after a transport error."
              },
              "reason": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "The push service's reason (such as `BadDeviceToken` or `TooManyRequests`) or the transport error; `null` when delivered."
              },
              "latencyMs": {
                "type": [
                  "number",
                  "null"
                ],
                "minimum": 0,
                "description": "How long the attempt took, in milliseconds."
              },
              "attempt": {
                "type": "integer",
                "minimum": 1,
                "description": "1 for the first attempt at this sequence on this device; each retry counts up."
              },
              "attemptedAt": {
                "type": "string",
                "format": "date-time"
              }
            },
            "example": {
              "id": 1842,
              "deviceId": "device-1",
              "platform": "ios",
              "sequence": 3,
              "event": "update",
              "priority": 10,
              "status": "delivered",
              "providerId": "6F4B3C2A-1D0E-4F5A-9B8C-7D6E5F4A3B2C",
              "reason": null,
              "latencyMs": 41.7,
              "attempt": 1,
              "attemptedAt": "2026-11-21T10:00:00Z"
            }
          },
          "DeliveryPage": {
            "type": "object",
            "description": "One page of an activity's delivery timeline, newest attempt first.",
            "required": [
              "data",
              "nextCursor"
            ],
            "properties": {
              "data": {
                "type": "array",
                "items": {
                  "$ref": "#/components/schemas/Delivery"
                }
              },
              "nextCursor": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "Pass as `cursor` to get the next (older) page; `null` on the last page."
              }
            }
          },
          "APNsSettings": {
            "type": "object",
            "description": "An app's non-secret APNs settings. The private key is not among them: it is sealed at rest and never returned.",
            "required": [
              "teamId",
              "keyId",
              "environment",
              "baseUrl",
              "caCertificate"
            ],
            "properties": {
              "teamId": {
                "type": "string",
                "pattern": "^[A-Z0-9]{10}$",
                "description": "Apple's 10-character team id.",
                "examples": [
                  "ABCDE12345"
                ]
              },
              "keyId": {
                "type": "string",
                "pattern": "^[A-Z0-9]{10}$",
                "description": "The 10-character id of the .p8 signing key.",
                "examples": [
                  "KEY1234567"
                ]
              },
              "environment": {
                "type": "string",
                "enum": [
                  "sandbox",
                  "production"
                ],
                "description": "Which APNs the pushes go to."
              },
              "baseUrl": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "The APNs host that overrides the environment's, e.g. the local emulator; `null` for Apple's."
              },
              "caCertificate": {
                "type": [
                  "string",
                  "null"
                ],
                "enum": [
                  "(set)",
                  null
                ],
                "description": "`(set)` when a CA certificate to trust for `baseUrl` is configured (the PEM itself is not shown); otherwise `null`."
              }
            }
          },
          "Credentials": {
            "type": "object",
            "description": "An app's credentials for one push provider, as operators see them: settings and health, never the secret.",
            "required": [
              "provider",
              "settings",
              "healthy",
              "healthReason",
              "updatedAt"
            ],
            "properties": {
              "provider": {
                "type": "string",
                "enum": [
                  "apns",
                  "fcm"
                ],
                "description": "The push provider: `apns` (iOS) or `fcm` (Android)."
              },
              "settings": {
                "oneOf": [
                  {
                    "$ref": "#/components/schemas/APNsSettings"
                  },
                  {
                    "$ref": "#/components/schemas/FCMSettings"
                  }
                ]
              },
              "healthy": {
                "type": "boolean",
                "description": "`false` once the push service refused the credentials: APNs twice, the second time with a freshly signed provider token (`InvalidProviderToken`, `ExpiredProviderToken`); FCM with `SENDER_ID_MISMATCH`, `THIRD_PARTY_AUTH_ERROR`, a 401 after a fresh access token, or a token endpoint that refuses the service account. Such attempts show in the delivery timeline as `credentials_rejected`. Setting credentials again makes them healthy."
              },
              "healthReason": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "Why the credentials are unhealthy; `null` while healthy."
              },
              "updatedAt": {
                "type": "string",
                "format": "date-time",
                "description": "When the credentials were set or their health last changed."
              }
            },
            "example": {
              "provider": "apns",
              "settings": {
                "teamId": "ABCDE12345",
                "keyId": "KEY1234567",
                "environment": "production",
                "baseUrl": null,
                "caCertificate": null
              },
              "healthy": true,
              "healthReason": null,
              "updatedAt": "2026-11-21T09:00:00Z"
            }
          },
          "CredentialsList": {
            "type": "object",
            "description": "An app's credentials, one entry per provider that has some.",
            "required": [
              "data"
            ],
            "properties": {
              "data": {
                "type": "array",
                "items": {
                  "$ref": "#/components/schemas/Credentials"
                }
              }
            }
          },
          "AppWithCredentials": {
            "description": "The calling app and its push credentials.",
            "allOf": [
              {
                "$ref": "#/components/schemas/App"
              },
              {
                "type": "object",
                "required": [
                  "credentials"
                ],
                "properties": {
                  "credentials": {
                    "type": "array",
                    "items": {
                      "$ref": "#/components/schemas/Credentials"
                    },
                    "description": "One entry per provider that has credentials; empty when none are set."
                  }
                }
              }
            ],
            "example": {
              "id": "app_0123456789ABCDEFGHIJ",
              "name": "Scores",
              "bundleId": "com.example.scores",
              "androidPackage": null,
              "createdAt": "2026-11-20T08:00:00Z",
              "credentials": [
                {
                  "provider": "apns",
                  "settings": {
                    "teamId": "ABCDE12345",
                    "keyId": "KEY1234567",
                    "environment": "production",
                    "baseUrl": null,
                    "caCertificate": null
                  },
                  "healthy": false,
                  "healthReason": "The push service refused the app's credentials",
                  "updatedAt": "2026-11-21T10:05:00Z"
                }
              ],
              "budget": {
                "hourly": null,
                "hourlyWithFrequentPushes": null
              }
            }
          },
          "SetAPNsCredentialsRequest": {
            "type": "object",
            "description": "An app's APNs token-auth credentials. For `baseUrl` and `caCertificate`, `null` is the same as leaving the field out.",
            "additionalProperties": false,
            "required": [
              "teamId",
              "keyId",
              "privateKey",
              "environment"
            ],
            "properties": {
              "teamId": {
                "type": "string",
                "pattern": "^[A-Z0-9]{10}$",
                "description": "Apple's 10-character team id (A-Z, 0-9). Otherwise: 422 `invalid_team_id`."
              },
              "keyId": {
                "type": "string",
                "pattern": "^[A-Z0-9]{10}$",
                "description": "The 10-character id of the .p8 key (A-Z, 0-9). Otherwise: 422 `invalid_key_id`."
              },
              "privateKey": {
                "type": "string",
                "description": "The contents of `AuthKey_XXXXXXXXXX.p8`: a PEM P-256 private key. One that does not parse: 422 `invalid_private_key`. Sealed at rest with AES-GCM under the server's master key and never returned.",
                "writeOnly": true
              },
              "environment": {
                "type": "string",
                "enum": [
                  "sandbox",
                  "production"
                ],
                "description": "Which APNs the pushes go to. Anything else: 422 `invalid_environment`."
              },
              "baseUrl": {
                "type": [
                  "string",
                  "null"
                ],
                "format": "uri",
                "pattern": "^https://",
                "description": "An https:// URL that overrides the environment's APNs host, e.g. `https://127.0.0.1:8443` for the local emulator. Otherwise: 422 `invalid_base_url`."
              },
              "caCertificate": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "A PEM CA certificate to trust for `baseUrl`."
              }
            },
            "example": {
              "teamId": "ABCDE12345",
              "keyId": "KEY1234567",
              "privateKey": "-----BEGIN PRIVATE KEY-----\nMIGTAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBHkwdwIBAQQg…\n-----END PRIVATE KEY-----\n",
              "environment": "production"
            }
          },
          "HealthStatus": {
            "type": "object",
            "required": [
              "status"
            ],
            "properties": {
              "status": {
                "type": "string",
                "enum": [
                  "ok",
                  "ready"
                ]
              }
            }
          },
          "SchemaFieldType": {
            "description": "The type of one field: a name (`string`, `integer`, `number`, `boolean`, `date`; a trailing `?` makes it optional, so it may be missing or null), or an object for composite types: `{\"type\": \"array\", \"items\": T}`, `{\"type\": \"object\", \"fields\": {name: T}}`, `{\"type\": \"enum\", \"values\": [\"a\", \"b\"]}`, each with an optional `\"optional\": true`.",
            "oneOf": [
              {
                "type": "string",
                "pattern": "^(string|integer|number|boolean|date)\\??$"
              },
              {
                "type": "object",
                "required": [
                  "type"
                ],
                "properties": {
                  "type": {
                    "type": "string",
                    "enum": [
                      "array",
                      "object",
                      "enum",
                      "string",
                      "integer",
                      "number",
                      "boolean",
                      "date"
                    ]
                  },
                  "items": {
                    "$ref": "#/components/schemas/SchemaFieldType"
                  },
                  "fields": {
                    "type": "object",
                    "additionalProperties": {
                      "$ref": "#/components/schemas/SchemaFieldType"
                    }
                  },
                  "values": {
                    "type": "array",
                    "items": {
                      "type": "string"
                    },
                    "minItems": 1
                  },
                  "optional": {
                    "type": "boolean"
                  }
                },
                "additionalProperties": false
              }
            ]
          },
          "AttributesTypeSchemaInput": {
            "type": "object",
            "required": [
              "contentState"
            ],
            "additionalProperties": false,
            "description": "The fields of the app's ContentState (and optionally of its static Attributes), as its `Codable` structs declare them.",
            "properties": {
              "contentState": {
                "type": "object",
                "additionalProperties": {
                  "$ref": "#/components/schemas/SchemaFieldType"
                }
              },
              "attributes": {
                "type": [
                  "object",
                  "null"
                ],
                "additionalProperties": {
                  "$ref": "#/components/schemas/SchemaFieldType"
                }
              },
              "dateEncoding": {
                "type": "string",
                "enum": [
                  "secondsSince2001",
                  "secondsSince1970"
                ],
                "default": "secondsSince2001",
                "description": "How `date` fields go to the phone. `secondsSince2001` is what a default `JSONDecoder` expects (`Date`'s own Codable form), and so what ActivityKit decodes unless the app changed its strategy. Callers may send dates as ISO-8601 text (converted) or as numbers (sent as given)."
              }
            },
            "example": {
              "contentState": {
                "status": "string",
                "minutesAway": "integer",
                "eta": "date",
                "note": "string?",
                "stops": {
                  "type": "array",
                  "items": "string"
                },
                "phase": {
                  "type": "enum",
                  "values": [
                    "preparing",
                    "onTheWay",
                    "delivered"
                  ]
                }
              },
              "attributes": {
                "orderNumber": "string"
              }
            }
          },
          "AttributesTypeSchema": {
            "type": "object",
            "required": [
              "attributesType",
              "contentState",
              "dateEncoding",
              "createdAt",
              "updatedAt"
            ],
            "description": "A registered schema, in its normalized form.",
            "properties": {
              "attributesType": {
                "type": "string"
              },
              "contentState": {
                "type": "object",
                "additionalProperties": {
                  "$ref": "#/components/schemas/SchemaFieldType"
                }
              },
              "attributes": {
                "type": "object",
                "additionalProperties": {
                  "$ref": "#/components/schemas/SchemaFieldType"
                }
              },
              "dateEncoding": {
                "type": "string",
                "enum": [
                  "secondsSince2001",
                  "secondsSince1970"
                ]
              },
              "createdAt": {
                "type": "string",
                "format": "date-time"
              },
              "updatedAt": {
                "type": "string",
                "format": "date-time"
              }
            }
          },
          "FCMSettings": {
            "type": "object",
            "description": "An app's non-secret FCM settings, read from its service account. The private key is sealed at rest and never returned.",
            "required": [
              "projectId",
              "clientEmail",
              "privateKeyId",
              "tokenUri",
              "baseUrl",
              "caCertificate"
            ],
            "properties": {
              "projectId": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "The Firebase project messages are sent for."
              },
              "clientEmail": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "The service account's email (the assertion's `iss`)."
              },
              "privateKeyId": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "The id of the service account's key (the assertion's `kid`)."
              },
              "tokenUri": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "Where access tokens are obtained."
              },
              "baseUrl": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "The FCM host that overrides `https://fcm.googleapis.com`, e.g. the local emulator; `null` for Google's."
              },
              "caCertificate": {
                "type": [
                  "string",
                  "null"
                ],
                "enum": [
                  "(set)",
                  null
                ],
                "description": "`(set)` when a CA certificate to trust is configured (the PEM itself is not shown); otherwise `null`."
              }
            }
          },
          "SetFCMCredentialsRequest": {
            "type": "object",
            "required": [
              "serviceAccount"
            ],
            "additionalProperties": false,
            "properties": {
              "serviceAccount": {
                "description": "The Firebase service-account JSON (Project settings → Service accounts → Generate new private key), as an object or as its text. Needs `project_id`, `private_key_id`, `private_key`, `client_email` and `token_uri`.",
                "oneOf": [
                  {
                    "type": "object"
                  },
                  {
                    "type": "string"
                  }
                ]
              },
              "baseUrl": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "An https URL to send to instead of `https://fcm.googleapis.com` (e.g. the local emulator)."
              },
              "caCertificate": {
                "type": [
                  "string",
                  "null"
                ],
                "description": "A PEM CA certificate to trust for `baseUrl` and the token URI."
              }
            }
          },
          "FCMLiveUpdateData": {
            "type": "object",
            "additionalProperties": false,
            "description": "The `data` of every FCM message Liveline sends to an Android instance (`{\"message\": {\"token\", \"data\", \"android\": {\"priority\": \"high\", \"ttl\", \"collapse_key\": <activity id>}}}`). Every value is a string (FCM allows no other); absent optional values are left out. `ttl` is the seconds until the stale date (`0s` once past), else `3600s` for an update and `28800s` for an end. Keep the highest `liveline_sequence` per activity and ignore lower or equal ones; an `end` is final. The keys and the values together must stay within 4096 bytes (checked when the API call arrives).",
            "required": [
              "liveline_activity_id",
              "liveline_event",
              "liveline_sequence",
              "liveline_timestamp",
              "liveline_content_state"
            ],
            "properties": {
              "liveline_activity_id": {
                "type": "string",
                "description": "The activity id."
              },
              "liveline_event": {
                "type": "string",
                "description": "`start`, `update` or `end`.",
                "enum": [
                  "start",
                  "update",
                  "end"
                ]
              },
              "liveline_sequence": {
                "type": "string",
                "description": "The activity's sequence number, decimal; strictly increases with every accepted state.",
                "pattern": "^[0-9]+$"
              },
              "liveline_timestamp": {
                "type": "string",
                "description": "When Liveline accepted the state: seconds since 1970, decimal (the iPhones' `aps.timestamp`).",
                "pattern": "^[0-9]+$"
              },
              "liveline_content_state": {
                "type": "string",
                "description": "The content state as JSON text (keys sorted)."
              },
              "liveline_stale_date": {
                "type": "string",
                "description": "Seconds since 1970, decimal: after it the state is out of date.",
                "pattern": "^[0-9]+$"
              },
              "liveline_dismissal_date": {
                "type": "string",
                "description": "`end` only: seconds since 1970, decimal, when to remove the notification.",
                "pattern": "^[0-9]+$"
              },
              "liveline_attributes_type": {
                "type": "string",
                "description": "`start` only: the attributes type name."
              },
              "liveline_attributes": {
                "type": "string",
                "description": "`start` only: the static attributes as JSON text."
              },
              "liveline_alert_title": {
                "type": "string",
                "description": "The alert's title, when the update carries one."
              },
              "liveline_alert_body": {
                "type": "string",
                "description": "The alert's body, when the update carries one."
              }
            },
            "example": {
              "liveline_activity_id": "order-1234",
              "liveline_event": "update",
              "liveline_sequence": "3",
              "liveline_timestamp": "1795255200",
              "liveline_content_state": "{\"minutesAway\":12,\"status\":\"On the way\"}",
              "liveline_stale_date": "1795256400"
            }
          },
          "BudgetReport": {
            "type": "object",
            "description": "How the activity's active iOS instances stand against Apple's hourly budget of priority-10 pushes (sliding hour). Updates go at priority 10 while an instance is within its budget and at 5 beyond it; alerts and ends always go at 10 and an explicit `priority` is honoured — all counted.",
            "required": [
              "hourlyLimit",
              "hourlyLimitWithFrequentPushes",
              "maxUsedLastHour",
              "instancesAtWarning",
              "instancesAtLimit",
              "lastWarningAt"
            ],
            "properties": {
              "hourlyLimit": {
                "type": "integer",
                "description": "Priority-10 pushes per instance per hour (configuration `liveline.budget.hourly`)."
              },
              "hourlyLimitWithFrequentPushes": {
                "type": "integer",
                "description": "The same for instances whose app reported frequent updates enabled."
              },
              "maxUsedLastHour": {
                "type": "integer",
                "description": "The most priority-10 pushes any instance received in the last hour."
              },
              "instancesAtWarning": {
                "type": "integer",
                "description": "Instances at or past 80 % of their budget."
              },
              "instancesAtLimit": {
                "type": "integer",
                "description": "Instances whose updates now go at priority 5."
              },
              "lastWarningAt": {
                "type": [
                  "string",
                  "null"
                ],
                "format": "date-time",
                "description": "When an instance last reached 80 % of its budget (a `budget.warning`, also logged); `null` if never."
              }
            }
          },
          "ActivityWithBudget": {
            "allOf": [
              {
                "$ref": "#/components/schemas/Activity"
              },
              {
                "type": "object",
                "required": [
                  "budget"
                ],
                "properties": {
                  "budget": {
                    "$ref": "#/components/schemas/BudgetReport"
                  }
                }
              }
            ]
          },
          "SetBudgetRequest": {
            "type": "object",
            "additionalProperties": false,
            "properties": {
              "hourly": {
                "type": [
                  "integer",
                  "null"
                ],
                "minimum": 0,
                "maximum": 3600,
                "description": "Priority-10 pushes per iOS instance per sliding hour; `null` or absent for the server's default."
              },
              "hourlyWithFrequentPushes": {
                "type": [
                  "integer",
                  "null"
                ],
                "minimum": 0,
                "maximum": 3600,
                "description": "The same for instances whose app reported frequent updates enabled; at least `hourly`."
              }
            }
          }
        },
        "responses": {
          "BadRequest": {
            "description": "The request is malformed (HTTP 400): `malformed_json` (the body is not a JSON object), `invalid_type` (a field has the wrong JSON type), `missing_field`, `unknown_field` (the request has a field this route does not know) or `invalid_cursor`.",
            "content": {
              "application/json": {
                "schema": {
                  "$ref": "#/components/schemas/Error"
                }
              }
            }
          },
          "Unauthorized": {
            "description": "No usable API key (HTTP 401): `unauthorized` (no `Authorization: Bearer <key>` header) or `invalid_api_key`.",
            "content": {
              "application/json": {
                "schema": {
                  "$ref": "#/components/schemas/Error"
                },
                "examples": {
                  "invalid_api_key": {
                    "value": {
                      "error": {
                        "code": "invalid_api_key",
                        "message": "The API key is not valid.",
                        "field": null
                      }
                    }
                  }
                }
              }
            }
          },
          "SecretKeyRequired": {
            "description": "The route needs the app's secret key (HTTP 403 `secret_key_required`): publishable keys may only register instances and report instance events.",
            "content": {
              "application/json": {
                "schema": {
                  "$ref": "#/components/schemas/Error"
                },
                "examples": {
                  "secret_key_required": {
                    "value": {
                      "error": {
                        "code": "secret_key_required",
                        "message": "This route needs the app's secret key (sk_…); publishable keys may only register instances and report instance events.",
                        "field": null
                      }
                    }
                  }
                }
              }
            }
          },
          "ActivityNotFound": {
            "description": "No such activity in this app (HTTP 404 `activity_not_found`).",
            "content": {
              "application/json": {
                "schema": {
                  "$ref": "#/components/schemas/Error"
                },
                "examples": {
                  "activity_not_found": {
                    "value": {
                      "error": {
                        "code": "activity_not_found",
                        "message": "No activity 'match-4711' in this app.",
                        "field": "activityId"
                      }
                    }
                  }
                }
              }
            }
          },
          "InstanceNotFound": {
            "description": "No instance for this device on this activity (HTTP 404 `instance_not_found`).",
            "content": {
              "application/json": {
                "schema": {
                  "$ref": "#/components/schemas/Error"
                },
                "examples": {
                  "instance_not_found": {
                    "value": {
                      "error": {
                        "code": "instance_not_found",
                        "message": "No instance for device 'device-1' on this activity.",
                        "field": "deviceId"
                      }
                    }
                  }
                }
              }
            }
          },
          "ActivityEnded": {
            "description": "The activity has ended and takes nothing more (HTTP 409 `activity_ended`).",
            "content": {
              "application/json": {
                "schema": {
                  "$ref": "#/components/schemas/Error"
                },
                "examples": {
                  "activity_ended": {
                    "value": {
                      "error": {
                        "code": "activity_ended",
                        "message": "Activity 'match-4711' has ended; it takes no further updates.",
                        "field": "activityId"
                      }
                    }
                  }
                }
              }
            }
          },
          "BodyTooLarge": {
            "description": "The request body is over 65536 bytes (HTTP 413 `body_too_large`).",
            "content": {
              "application/json": {
                "schema": {
                  "$ref": "#/components/schemas/Error"
                }
              }
            }
          },
          "InternalError": {
            "description": "The server failed to handle the request (HTTP 500 `internal_error`); the error is logged.",
            "content": {
              "application/json": {
                "schema": {
                  "$ref": "#/components/schemas/Error"
                }
              }
            }
          },
          "AdminUnauthorized": {
            "description": "No valid admin token (HTTP 401): `unauthorized` (no `Authorization: Bearer <token>` header) or `invalid_admin_token`.",
            "content": {
              "application/json": {
                "schema": {
                  "$ref": "#/components/schemas/Error"
                }
              }
            }
          },
          "AdminDisabled": {
            "description": "The admin API is off (HTTP 403 `admin_api_disabled`): the server runs without `LIVELINE_ADMIN_TOKEN` (or `--admin-token-file`).",
            "content": {
              "application/json": {
                "schema": {
                  "$ref": "#/components/schemas/Error"
                }
              }
            }
          }
        },
        "parameters": {
          "ActivityId": {
            "name": "activityId",
            "in": "path",
            "required": true,
            "description": "The activity id chosen by the backend (percent-decoded before validation).",
            "schema": {
              "$ref": "#/components/schemas/Identifier"
            }
          },
          "DeviceId": {
            "name": "deviceId",
            "in": "path",
            "required": true,
            "description": "The device id chosen by the app (percent-decoded before validation).",
            "schema": {
              "$ref": "#/components/schemas/Identifier"
            }
          },
          "AppId": {
            "name": "appId",
            "in": "path",
            "required": true,
            "description": "Liveline's id for the app (`app_…`).",
            "schema": {
              "type": "string"
            }
          },
          "Limit": {
            "name": "limit",
            "in": "query",
            "required": false,
            "description": "The page size, 1 to 200. Not an integer: 400 `invalid_type`; out of range: 422 `invalid_limit`.",
            "schema": {
              "type": "integer",
              "minimum": 1,
              "maximum": 200,
              "default": 50
            }
          },
          "Cursor": {
            "name": "cursor",
            "in": "query",
            "required": false,
            "description": "The `nextCursor` of the previous page. One this server did not issue: 400 `invalid_cursor`.",
            "schema": {
              "type": "string",
              "maxLength": 256
            }
          }
        },
        "securitySchemes": {
          "secretKey": {
            "type": "http",
            "scheme": "bearer",
            "description": "The app's secret key (`sk_…`), used by the backend: `Authorization: Bearer sk_…`. Keep it on the server."
          },
          "publishableKey": {
            "type": "http",
            "scheme": "bearer",
            "description": "The app's publishable key (`pk_…`), shipped in the app on a phone: `Authorization: Bearer pk_…`. It may only register instances and report instance events."
          },
          "adminToken": {
            "type": "http",
            "scheme": "bearer",
            "description": "The operator's admin token, configured with `LIVELINE_ADMIN_TOKEN` or `--admin-token-file`: `Authorization: Bearer <token>`."
          }
        }
      }
    }
    """#
}
